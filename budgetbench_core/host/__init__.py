"""The plugin host: strategies and memory systems run in worker processes of their own.

Private to the core (the engine uses it; plugins never import it). ``wire`` is the plain-data
protocol between the harness and a worker, ``worker`` the program a worker runs, ``guard`` the
process that forks a worker and ends whatever it leaves behind, ``remote`` the harness's side
(a strategy proxy per worker), ``landlock`` the confinement, ``metering``/``gateway`` the model
calls a plugin's own SDK makes, ``proxy`` its outside hosts.
"""
