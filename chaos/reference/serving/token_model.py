"""The reference streaming model: a tiny seeded GRU language model that generates one token per forward pass.

Contract:

- :func:`build_token_model` gives the same weights for the same seed in every process (embedding 64 x 32,
  GRU cell 32 -> 64, head 64 -> 64, an encoder from the prompt's features to the first state).
- A prompt's features are :func:`~chaos.reference.serving.wire.prompt_features` of its text; generation is
  :meth:`TokenModel.start` (the prompt's state) then :meth:`TokenModel.step` per token: one GRU cell and one
  head forward, then a draw from the softmax by a generator seeded from the prompt and the seed. So the
  tokens of a prompt are a pure function of (weights, prompt, seed): a replica asked to resume at token k
  replays k steps and continues where another replica with the same weights was cut.
- ``forward(features)`` (what ``/v1/predict`` and the correctness probe call) runs :data:`PROBE_STEPS` greedy
  steps from those features and returns each step's largest and mean logit (``OUTPUT_DIM`` values): every
  weight on the probe's path (all but the embedding rows of tokens it never picks) moves the answer, and a
  flipped exponent bit anywhere in the head shows in a largest logit.
"""

from __future__ import annotations

import hashlib

import torch
from torch import nn

from chaos.reference.serving.wire import INPUT_DIM, OUTPUT_DIM

_WORDS = (
    "the a model token stream replica gateway answer request fault kill freeze slow fast first last "
    "open closed cut resume safe load time gap byte bit weight layer step batch queue node rank port "
    "alive down up wrong right clean noisy late early big small warm cold read write send wait done "
    "more less some every each never always maybe yes no fleet ok"
).split()
VOCAB: tuple[str, ...] = tuple(_WORDS[:64])
EMBED, HIDDEN = 32, 64
PROBE_STEPS = OUTPUT_DIM // 2
BOS = 0  # the first input token
_SEED_OFFSET = 104729  # not the MLPs' seeds


class TokenModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encode = nn.Linear(INPUT_DIM, HIDDEN)
        self.embed = nn.Embedding(len(VOCAB), EMBED)
        self.cell = nn.GRUCell(EMBED, HIDDEN)
        self.head = nn.Linear(HIDDEN, len(VOCAB))

    def start(self, features: torch.Tensor) -> torch.Tensor:
        """The state before the first token, from a ``(1, INPUT_DIM)`` prompt feature row."""
        return torch.tanh(self.encode(features))

    def step(self, state: torch.Tensor, token: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One token's forward: ``(next state, logits over VOCAB)``."""
        state = self.cell(self.embed(torch.tensor([token])), state)
        return state, self.head(state)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        state, token = self.start(features), BOS
        summary: list[torch.Tensor] = []
        for _ in range(PROBE_STEPS):
            state, logits = self.step(state, token)
            token = int(logits[0].argmax())
            summary += [logits.max(dim=1).values, logits.mean(dim=1)]
        return torch.stack(summary, dim=1)  # (1, 2 * PROBE_STEPS) = (1, OUTPUT_DIM)


def build_token_model(seed: int) -> TokenModel:
    """The model with weights drawn from ``seed``, in eval mode, without autograd."""
    rng_state = torch.random.get_rng_state()
    torch.manual_seed(seed + _SEED_OFFSET)
    try:
        model = TokenModel()
    finally:
        torch.random.set_rng_state(rng_state)
    model.eval()
    for param in model.parameters():
        param.requires_grad_(False)
    return model


def sampler(prompt: str, seed: int) -> torch.Generator:
    """The draws of one prompt's answer: the same prompt and seed give the same tokens on every replica."""
    digest = hashlib.sha256(f"{seed}:{prompt}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))


class Generation:
    """One answer being generated: call :meth:`next` once per token (each call is one real forward)."""

    def __init__(self, model: TokenModel, features: list[float], prompt: str, seed: int) -> None:
        self.model = model
        self.draws = sampler(prompt, seed)
        with torch.no_grad():
            self.state = model.start(torch.tensor(features, dtype=torch.float32).unsqueeze(0))
        self.token = BOS

    def next(self) -> int:
        """The next token's id (one GRU step, one head, one draw)."""
        with torch.no_grad():
            self.state, logits = self.model.step(self.state, self.token)
            probs = torch.softmax(logits[0], dim=0)
            # A corrupted weight can make the logits non-finite: the answer is then garbage, not a crash.
            probs = torch.nan_to_num(probs, nan=0.0, posinf=0.0, neginf=0.0)
            if float(probs.sum()) <= 0:
                self.token = 0
            else:
                self.token = int(torch.multinomial(probs, 1, generator=self.draws))
        return self.token
