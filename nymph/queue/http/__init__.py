"""The queue's HTTP side: the app factory (:mod:`.app`), running it (:mod:`.serve`,
:mod:`.server`), the middlewares, request bodies, typed app keys and the routes by audience."""
