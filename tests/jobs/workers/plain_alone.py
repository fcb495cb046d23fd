"""A script that trains alone, written without dtprof (``dtprof run`` records it), with a
GradScaler; it raises at the step in FAIL_AT."""

import os

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
fail_at = int(os.environ.get("FAIL_AT", "-1"))
for step in range(int(os.environ.get("STEPS", "10"))):
    loss = model(torch.randn(8, 16)).pow(2).mean()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
    if step == fail_at:
        raise RuntimeError("planted failure")
