"""Ray Serve's side of serve_bench: the echo deployment of issue 53's
anchor (2 replicas x 0.5 CPU answering {"ok": true}), served on the port
given, until stdin closes. Prints "ready" once it serves.

    python ray_serve_echo.py PORT
"""

import sys

import ray
from ray import serve


@serve.deployment(num_replicas=2, ray_actor_options={"num_cpus": 0.5})
class Echo:
    async def __call__(self, request):
        return {"ok": True}


def main():
    port = int(sys.argv[1])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(Echo.bind(), route_prefix="/echo")
    print("ready", flush=True)
    sys.stdin.read()
    serve.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
