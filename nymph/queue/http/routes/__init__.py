"""HTTP routes by audience: :mod:`.user` (providers, modes, launches, instances; user tokens)
and :mod:`.daemon` (the dispatch API; daemon sessions, registered with the daemon token)."""
