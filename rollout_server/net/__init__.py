"""The shared HTTP floor: plumbing any package of rollbridge may import.

It depends only on the light base install (trio, hypercorn's config, httpx, httptools, h11)
and imports nothing else of the project, so the rollout SDK, the bridge and the launcher can
all stand on it. The lean HTTP/1.1 room: :mod:`.limits` (every bound, named once), :mod:`.h1`
and :mod:`.wirebytes` (the server connection and its writers), :mod:`.leanserve` (the
listener), :mod:`.wire`, :mod:`.wirefast`, :mod:`.wireerrors`, :mod:`.reply` and
:mod:`.h1client` (the client); besides it :mod:`.asgi`, :mod:`.httpclient`, :mod:`.jsonbytes`, :mod:`.hosts` and :mod:`.secrets`.
"""
