"""Ray Serve's side of serve_bench's MNIST case: the CNN of nimbus-train's
train_mnist example in PyTorch, with the weights of a train_mnist
checkpoint (its checkpoint.safetensors, read here), 2 replicas x 0.5 CPU,
torch on one thread, no batching. A request is a JSON array of 784 pixel
intensities in [0, 1]; the answer is the digit and its probability, as
nimbus's serve_mnist answers. Served on the port given until stdin closes;
prints "ready" once it serves.

    python ray_serve_mnist.py PORT CHECKPOINT_DIR
"""

import json
import struct
import sys

import ray
import torch
from ray import serve
from torch import nn

MEAN, STD = 0.1307, 0.3081


def load_model(checkpoint_dir):
    """The model's tensors of a nimbus checkpoint (safetensors, f32)."""
    with open(f"{checkpoint_dir}/checkpoint.safetensors", "rb") as f:
        data = f.read()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + size])
    tensors = {}
    for name, entry in header.items():
        if not name.startswith("model."):
            continue
        if entry["dtype"] != "F32":
            raise ValueError(f"{name} is {entry['dtype']}; this script reads F32")
        start, end = entry["data_offsets"]
        raw = bytearray(data[8 + size + start : 8 + size + end])
        tensors[name[len("model.") :]] = torch.frombuffer(raw, dtype=torch.float32).reshape(
            entry["shape"]
        )
    return tensors


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(3136, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2).flatten(1)
        return self.fc2(torch.relu(self.fc1(x)))


@serve.deployment(num_replicas=2, ray_actor_options={"num_cpus": 0.5})
class Mnist:
    def __init__(self, checkpoint_dir):
        torch.set_num_threads(1)
        self.model = Cnn()
        self.model.load_state_dict(load_model(checkpoint_dir))
        self.model.eval()

    async def __call__(self, request):
        pixels = await request.json()
        if len(pixels) != 784:
            return {"error": f"an image is 784 pixel intensities, got {len(pixels)}"}
        x = (torch.tensor(pixels, dtype=torch.float32).view(1, 1, 28, 28) - MEAN) / STD
        with torch.no_grad():
            probabilities = torch.softmax(self.model(x), dim=-1)[0]
        probability, digit = probabilities.max(dim=-1)
        return {"digit": int(digit), "probability": float(probability)}


def main():
    port, checkpoint_dir = int(sys.argv[1]), sys.argv[2]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(Mnist.bind(checkpoint_dir), route_prefix="/mnist")
    print("ready", flush=True)
    sys.stdin.read()
    serve.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
