"""A base for objects that hold connections: ``async with`` closes them."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class Closeable:
    """``async with thing:`` calls ``await thing.close()`` on the way out."""

    async def close(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
