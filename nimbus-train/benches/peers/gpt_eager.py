"""The bench's small GPT (benches/models/gpt.rs) trained by a plain
PyTorch eager loop on GPU 0: the same shape, bf16 parameters and
activations, SGD with momentum, generated tokens, the loss read back
every step. Usage: gpt_eager.py VOCAB CONTEXT DIM LAYERS HEADS BATCH
STEPS WARMUP; prints `tokens_per_s <value>`."""

import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

vocab, context, dim, layers, heads, batch, steps, warmup = (int(a) for a in sys.argv[1:9])


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.project = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        qkv = self.qkv(self.norm1(x)).view(b, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
        x = x + self.project(attended.transpose(1, 2).contiguous().view(b, t, d))
        return x + self.down(F.gelu(self.up(self.norm2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self):
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(context, dim)
        self.blocks = nn.ModuleList(Block() for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def loss(self, inputs, targets):
        positions = torch.arange(inputs.shape[1], device=inputs.device)
        x = self.tokens(inputs) + self.positions(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.view(-1, vocab).float(), targets.reshape(-1))


torch.manual_seed(0)
device = torch.device("cuda", 0)
model = Gpt().to(device=device, dtype=torch.bfloat16)
# One parameter at a time, as nimbus's Sgd (not the multi-tensor foreach).
sgd = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, foreach=False)
start = time.perf_counter()
for step in range(steps):
    if step == warmup:
        start = time.perf_counter()
    torch.manual_seed(1 + step)
    tokens = torch.randint(vocab, (batch, context + 1), device=device)
    loss = model.loss(tokens[:, :context], tokens[:, 1:])
    sgd.zero_grad()
    loss.backward()
    sgd.step()
    loss.item()
print(f"tokens_per_s {(steps - warmup) * batch * context / (time.perf_counter() - start):.1f}", flush=True)
