"""Receivers of the relay's webhooks: verify the signature, claim the id, write once.

``functions_receiver``: an Azure Functions HTTP trigger (a Blueprint) over asyncpg;
``aiohttp_receiver``: an aiohttp service over SQLAlchemy's AsyncSession. Both write to the table
of ``shipments.sql``; see docs/consumer.md.
"""
