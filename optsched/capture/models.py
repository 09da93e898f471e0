"""Built-in models to capture: each factory returns dict(model, inputs, targets, loss_fn).

Small by default so tests run in seconds; the keyword arguments scale them up.
GPT-2 and BERT need `transformers` and are built from their configs with
random weights (nothing is downloaded).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def mlp(batch: int = 32, width: int = 256, depth: int = 4, classes: int = 10) -> dict:
    layers: list[nn.Module] = []
    for i in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()] if i < depth - 1 else [nn.Linear(width, classes)]
    return {"model": nn.Sequential(*layers), "inputs": (torch.randn(batch, width),),
            "targets": (torch.randint(0, classes, (batch,)),), "loss_fn": F.cross_entropy}


class _Block(nn.Module):
    """A ResNet basic block: two 3x3 convolutions with batch norm and a skip connection."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.skip = nn.Sequential() if stride == 1 and cin == cout else \
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(h)) + self.skip(x))


def cnn(batch: int = 8, size: int = 32, width: int = 16, blocks: int = 2, classes: int = 10) -> dict:
    layers: list[nn.Module] = [nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                               nn.MaxPool2d(2)]
    c = width
    for i in range(blocks):
        out = width * 2 ** i
        layers.append(_Block(c, out, 1 if i == 0 else 2))
        c = out
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, classes)]
    return {"model": nn.Sequential(*layers), "inputs": (torch.randn(batch, 3, size, size),),
            "targets": (torch.randint(0, classes, (batch,)),), "loss_fn": F.cross_entropy}


class _Encoder(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, layers: int, dropout: float):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens)))


def _token_loss(logits, targets):
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def transformer(batch: int = 4, seq: int = 32, vocab: int = 100, d: int = 64, heads: int = 4, layers: int = 2,
                dropout: float = 0.0) -> dict:
    """`torch.nn.TransformerEncoder` language model; dropout 0 by default so every op can be recomputed."""
    return {"model": _Encoder(vocab, d, heads, layers, dropout),
            "inputs": (torch.randint(0, vocab, (batch, seq)),),
            "targets": (torch.randint(0, vocab, (batch, seq)),), "loss_fn": _token_loss}


def _need_transformers():
    try:
        import transformers
    except ImportError as e:
        from .trace import CaptureError

        raise CaptureError("this example needs the transformers package",
                           hint="pip install transformers") from e
    return transformers


def gpt2(batch: int = 2, seq: int = 64, layers: int = 2, d: int = 128, heads: int = 4, vocab: int = 1000,
         dropout: float = 0.0) -> dict:
    """GPT-2 (transformers) from a config with random weights.

    `layers=12, d=768, heads=12, vocab=50257` is GPT-2 small. The output embedding is not tied to the input
    one (capture refuses tied parameters), which adds one vocab x d tensor.
    """
    tf = _need_transformers()
    cfg = tf.GPT2Config(n_layer=layers, n_embd=d, n_head=heads, vocab_size=vocab, n_positions=max(seq, 64),
                        resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
                        bos_token_id=vocab - 1, eos_token_id=vocab - 1, attn_implementation="eager",
                        tie_word_embeddings=False)
    model = tf.GPT2LMHeadModel(cfg)
    model.config.use_cache = False
    tokens = torch.randint(0, vocab, (batch, seq))
    return {"model": _LogitsOnly(model, True), "inputs": (tokens,), "targets": (tokens.clone(),),
            "loss_fn": _shifted_loss}


def bert(batch: int = 2, seq: int = 64, layers: int = 2, d: int = 128, heads: int = 4, vocab: int = 1000,
         dropout: float = 0.0) -> dict:
    """BERT (transformers) masked-LM head from a config with random weights."""
    tf = _need_transformers()
    cfg = tf.BertConfig(num_hidden_layers=layers, hidden_size=d, num_attention_heads=heads, vocab_size=vocab,
                        intermediate_size=4 * d, max_position_embeddings=max(seq, 64),
                        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
                        attn_implementation="eager", tie_word_embeddings=False)
    model = tf.BertForMaskedLM(cfg)
    tokens = torch.randint(0, vocab, (batch, seq))
    return {"model": _LogitsOnly(model, False), "inputs": (tokens,), "targets": (tokens.clone(),),
            "loss_fn": _token_loss}


class _LogitsOnly(nn.Module):
    """A transformers model returning its logits tensor (its output object does not trace into a loss)."""

    def __init__(self, model: nn.Module, causal: bool):
        super().__init__()
        self.model = model
        self.causal = causal

    def forward(self, tokens):
        # transformers checks the mask or the position ids with data-dependent Python branches: a causal model
        # gets an explicit all-ones mask (skipping the position-id check), a bidirectional one no mask at all
        mask = torch.ones_like(tokens) if self.causal else None
        return self.model(input_ids=tokens, attention_mask=mask).logits


def _shifted_loss(logits, tokens):
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())


BUILTIN = {"mlp": mlp, "cnn": cnn, "transformer": transformer, "gpt2": gpt2, "bert": bert}
