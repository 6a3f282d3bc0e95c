"""The queue's SQL: small modules of synchronous functions that each take a connection and run
inside the caller's transaction on the database thread (see :mod:`nymph.queue.db`)."""
