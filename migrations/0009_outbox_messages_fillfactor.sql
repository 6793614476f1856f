-- Room on every page for the row's next versions. A delivery updates each row twice (the lease,
-- then its outcome); with half of each page left free both new versions land on the row's own
-- page, where the WAL record holds only the bytes that changed (not the whole row and its payload)
-- and no extra lock record is written to move it elsewhere. The old versions are pruned as the
-- pages are read again. Only pages filled from now on keep the room: rows already in the table
-- stay where they are, and work as before.
ALTER TABLE outbox_messages SET (fillfactor = 50);
