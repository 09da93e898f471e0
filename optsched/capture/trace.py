"""Trace one training step into an ATen-level joint graph, and read it as an optsched `Graph`.

`export_step` runs `aot_export_module` on the model with its loss folded into
the forward, so forward, loss and backward come out as one FX graph whose
inputs are parameters, buffers and data, and whose outputs are buffer
updates, the loss and the parameter gradients.

`joint_to_graph` turns that FX graph into optsched nodes:
- views (any op whose schema says its result aliases an input: view, t,
  detach, expand, permute, ...) are folded into the node that owns the
  storage, so bytes are counted once per storage and readers of a view read
  its owner;
- a multi-output op becomes one node per used output: the first used output
  (the *primary*) carries the op's cost and holds the other outputs as
  workspace while it runs; each other output is a zero-cost node that reads
  the primary and the op's inputs, so the executor hands over the tensor the
  primary's run produced, and names the primary in `output_of`, so the
  simulator counts it from that run. Such an output is not recomputable: recomputing it
  alone would run the whole op again, which its zero cost would hide (the
  primary may still be recomputed);
- dead nodes (a `detach` nobody reads) are dropped;
- a node descending from the loss is `backward`, the loss is `loss`, the rest
  `forward`; random ops (dropout, ...) are not recomputable, since a second
  run would draw a different mask;
- required results: the loss, every parameter gradient and every buffer
  update, and the parameters and buffers themselves (the model keeps them;
  with an optimizer, the updated parameters instead).

`meta["capture"]` maps each node to its FX node name and records the
parameter, buffer and input order, so the executor can retrace the model and
check that a graph file belongs to it.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, replace

import torch
from torch import nn

from ..errors import OptschedError
from ..graph import Graph, Node, check_graph


class CaptureError(OptschedError):
    """The model could not be traced."""


@dataclass(frozen=True)
class Step:
    """A traced training step: the joint FX graph and what its placeholders and outputs mean."""

    gm: torch.fx.GraphModule
    params: dict[str, str]      # placeholder name -> parameter FQN
    buffers: dict[str, str]     # placeholder name -> buffer FQN
    inputs: tuple[str, ...]     # placeholder names of the data inputs, then the targets
    loss: str                   # FX node name of the loss
    grads: dict[str, str]       # FX output node name -> parameter FQN it is the gradient of
    buffer_updates: dict[str, str]  # FX output node name -> buffer FQN it updates
    num_inputs: int             # how many of `inputs` go to the model (the rest go to the loss)


def default_loss(out):
    """A scalar from whatever the model returns: its `.loss` if it has one, else the mean of the first tensor."""
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    if isinstance(out, dict):
        out = next(iter(out.values()))
    while isinstance(out, (tuple, list)):
        out = out[0]
    if not isinstance(out, torch.Tensor):
        raise CaptureError(f"the model returned {type(out).__name__}, not a tensor",
                           hint="pass loss_fn= to say how its output becomes a scalar loss")
    return out if out.dim() == 0 else out.float().mean()


class _WithLoss(nn.Module):
    def __init__(self, model: nn.Module, loss_fn, num_inputs: int):
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn
        self.num_inputs = num_inputs

    def forward(self, *args):
        out = self.model(*args[:self.num_inputs])
        loss = self.loss_fn(out, *args[self.num_inputs:]) if self.loss_fn else default_loss(out)
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise CaptureError("the loss is not a scalar tensor",
                               hint="loss_fn must return a 0-dimensional tensor, e.g. F.cross_entropy(out, y)")
        return (loss,)


def _as_tuple(x) -> tuple:
    if x is None:
        return ()
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


class _ModuleStack:
    """Which submodule is running, so a tracing failure can name it."""

    def __init__(self, model: nn.Module):
        self.stack: list[str] = []
        self.handles = []
        for name, mod in model.named_modules():
            self.handles.append(mod.register_forward_pre_hook(lambda m, a, name=name: self._push(name)))
            self.handles.append(mod.register_forward_hook(lambda m, a, o: self._pop()))

    def _push(self, name):
        self.stack.append(name)

    def _pop(self):
        self.stack.pop()

    def close(self):
        for h in self.handles:
            h.remove()


def export_step(model: nn.Module, inputs, targets=None, loss_fn=None) -> Step:
    """Trace forward, loss and backward of `model` on `inputs` (and `targets`, fed to `loss_fn`)."""
    from torch._functorch.aot_autograd import aot_export_module

    inputs, targets = _as_tuple(inputs), _as_tuple(targets)
    if not inputs:
        raise CaptureError("no example inputs given", hint="pass the tensors one forward call takes")
    for i, t in enumerate(inputs + targets):
        if not isinstance(t, torch.Tensor):
            what = f"input {i}" if i < len(inputs) else f"target {i - len(inputs)}"
            raise CaptureError(f"{what} is a {type(t).__name__}, not a tensor", field="example_inputs")
    if not any(p.requires_grad for p in model.parameters()):
        raise CaptureError("the model has no trainable parameter", hint="there is no backward pass to schedule")
    tied = _tied_params(model)
    if tied:  # the tracer lifts each name as its own input and gives each a partial gradient
        raise CaptureError(f"parameters {tied[0]!r} and {tied[1]!r} are one tied tensor, which the traced step "
                           "would split into two partial gradients", hint="untie them for capture (for transformers: "
                           "tie_word_embeddings=False); memory differs only by that one tensor")
    wrapped = _WithLoss(model, loss_fn, len(inputs))
    modules = _ModuleStack(model)
    frozen: list[nn.Parameter] = []
    args = _fake_args(inputs + targets)
    try:
        try:
            gm, sig = aot_export_module(wrapped, args, trace_joint=True, output_loss_index=0)
        except AssertionError as e:
            if "did not receive a gradient" not in str(e):
                raise
            # parameters the loss does not reach (a pooler a masked-LM head skips) get no gradient:
            # trace them as constants, as autograd would leave their .grad untouched
            frozen = _unreached_params(wrapped, inputs + targets)
            for p in frozen:
                p.requires_grad_(False)
            gm, sig = aot_export_module(wrapped, args, trace_joint=True, output_loss_index=0)
    except CaptureError:
        raise
    except Exception as e:  # noqa: BLE001 - any tracing failure becomes one readable message
        # forward hooks do not run on an exception, so the stack still ends at the failing module
        where = (modules.stack[-1] if modules.stack else "") or type(model).__name__
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CaptureError(f"tracing failed in module {where!r}: {type(e).__name__}: {first}",
                           hint="the step must be traceable by torch.export: avoid data-dependent Python control "
                                "flow and .item() in forward, or capture a submodule") from e
    finally:
        modules.close()
        for p in frozen:
            p.requires_grad_(True)
    strip = lambda fqn: fqn.removeprefix("model.")
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    bw = sig.backward_signature
    return Step(
        gm=gm,
        params={k: strip(v) for k, v in sig.inputs_to_parameters.items()},
        buffers={k: strip(v) for k, v in sig.inputs_to_buffers.items()},
        inputs=tuple(p for p in placeholders if p in set(sig.user_inputs)),
        loss=sig.user_outputs[0],
        grads={k: strip(v) for k, v in bw.gradients_to_parameters.items()},
        buffer_updates={k: strip(v) for k, v in sig.buffers_to_mutate.items()},
        num_inputs=len(inputs),
    )


def _fake_args(args: tuple) -> tuple:
    """Fake copies of the example tensors: given real ones, aot_export_module (torch 2.13) also runs the whole
    step for real, which for GPT-2 small takes four times as long and holds its activations, 2.7 GB."""
    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    mode = detect_fake_mode(args) or FakeTensorMode(allow_non_fake_inputs=True)
    return tuple(a if isinstance(a, FakeTensor) else mode.from_tensor(a) for a in args)


def _tied_params(model: nn.Module) -> tuple[str, str] | None:
    seen: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            return seen[id(p)], name
        seen[id(p)] = name
    return None


def _unreached_params(wrapped: nn.Module, args: tuple) -> list[nn.Parameter]:
    """Trainable parameters that get no gradient from the loss, found by a backward pass on fake tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    params = [p for p in wrapped.parameters() if p.requires_grad]
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake_args = tuple(mode.from_tensor(a) for a in args)
        loss = wrapped(*fake_args)[0]
        grads = torch.autograd.grad(loss, params, allow_unused=True)
    return [p for p, g in zip(params, grads, strict=True) if g is None]


def is_view(node: torch.fx.Node) -> bool:
    """True when the op's result aliases its first input (a view, transpose, detach, ...)."""
    target = node.target
    schema = getattr(target, "_schema", None)
    if schema is None or not schema.returns:
        return False
    alias = schema.returns[0].alias_info
    return alias is not None and not alias.is_write


def is_random(node: torch.fx.Node) -> bool:
    tags = getattr(node.target, "tags", ())
    return torch.Tag.nondeterministic_seeded in tags


def storage_bytes(val) -> int:
    return int(val.untyped_storage().nbytes())


def live_nodes(gm: torch.fx.GraphModule) -> set[str]:
    """FX nodes an output depends on."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    live: set[str] = set()
    stack = list(out.all_input_nodes)
    while stack:
        n = stack.pop()
        if n.name not in live:
            live.add(n.name)
            stack.extend(n.all_input_nodes)
    return live


def _descendants(node: torch.fx.Node) -> set[str]:
    seen: set[str] = set()
    stack = list(node.users)
    while stack:
        n = stack.pop()
        if n.name not in seen and n.op != "output":
            seen.add(n.name)
            stack.extend(n.users)
    return seen


@dataclass(frozen=True)
class Folding:
    """How FX nodes map onto optsched nodes."""

    owner: dict[str, str]          # every live FX tensor node -> the optsched node owning its storage
    primary: dict[str, str]        # multi-output op FX name -> its primary output's node id
    outputs: dict[str, list[str]]  # multi-output op FX name -> node ids of its used outputs


def fold(step: Step) -> Folding:
    """Resolve views to storage owners and multi-output ops to their outputs."""
    live = live_nodes(step.gm)
    owner: dict[str, str] = {}
    primary: dict[str, str] = {}
    outputs: dict[str, list[str]] = {}
    for n in step.gm.graph.nodes:
        if n.name not in live:
            continue
        if n.op == "placeholder":
            owner[n.name] = n.name
        elif n.op == "call_function" and n.target is operator.getitem and is_view(n.args[0]):
            owner[n.name] = owner[n.args[0].args[0].name]  # a piece of split/unbind/chunk: a view
        elif n.op == "call_function" and n.target is operator.getitem:
            owner[n.name] = n.name
            op = n.args[0].name
            outputs.setdefault(op, []).append(n.name)
            primary.setdefault(op, n.name)
        elif n.op == "call_function" and is_view(n):
            owner[n.name] = owner[n.args[0].name]
        elif n.op == "call_function" and not isinstance(n.meta.get("val"), (tuple, list)):
            owner[n.name] = n.name
    return Folding(owner, primary, outputs)


def _tensor_inputs(n: torch.fx.Node, owner: dict[str, str]) -> list[str]:
    return list(dict.fromkeys(owner[a.name] for a in n.all_input_nodes if a.name in owner))


def joint_to_graph(step: Step, cost_of, *, name: str = "", optimizer: str | None = None) -> Graph:
    """Nodes of the optsched graph for a traced step. `cost_of(fx_node)` gives {device kind: seconds}."""
    gm = step.gm
    live = live_nodes(gm)
    f = fold(step)
    by_name = {n.name: n for n in gm.graph.nodes}
    loss_node = by_name[step.loss]
    backward = _descendants(loss_node)
    loss_owner = f.owner[step.loss]
    required = {f.owner[x] for x in (*step.grads, *step.buffer_updates, step.loss)}
    if not optimizer:
        required |= set(step.params) | set(step.buffers)  # the model keeps them after the step
    zero = {"cuda": 0.0, "cpu": 0.0}
    nodes: list[Node] = []
    fx_of: dict[str, str] = {}
    random_ids: list[str] = []

    def kind_of(fx_name: str) -> str:
        if fx_name == loss_owner:
            return "loss"
        return "backward" if fx_name in backward else "forward"

    for n in gm.graph.nodes:
        if n.name not in live or n.op == "output":
            continue
        val = n.meta.get("val")
        if n.op == "placeholder":
            if n.name in step.params:
                kind, op = "param", f"param {step.params[n.name]}"
            elif n.name in step.buffers:
                kind, op = "param", f"buffer {step.buffers[n.name]}"
            else:
                k = step.inputs.index(n.name)
                kind = "input"
                op = f"input {k}" if k < step.num_inputs else f"target {k - step.num_inputs}"
            nodes.append(Node(n.name, op, kind, (), zero, storage_bytes(val), recomputable=False,
                              required=n.name in required))
            fx_of[n.name] = n.name
            continue
        if n.op != "call_function" or f.owner.get(n.name) != n.name:
            if isinstance(val, (tuple, list)) and n.name in f.outputs:
                _multi_output(n, f, step, cost_of, kind_of, required, nodes, fx_of, random_ids)
            continue
        if n.target is operator.getitem:
            continue  # emitted with its multi-output op
        rnd = is_random(n)
        if rnd:
            random_ids.append(n.name)
        nodes.append(Node(n.name, _op_name(n), kind_of(n.name), tuple(_tensor_inputs(n, f.owner)),
                          runnable(cost_of(n), n), storage_bytes(val), recomputable=not rnd,
                          required=n.name in required))
        fx_of[n.name] = n.name
    if optimizer:
        extra = _optimizer_nodes(step, f, nodes, optimizer, cost_of)
        placeholders = sum(n.kind in ("param", "input") for n in nodes)
        nodes[placeholders:placeholders] = [n for n in extra if n.kind == "param"]
        nodes += [n for n in extra if n.kind != "param"]
    meta = {
        "capture": {
            "fx": fx_of,
            "params": step.params,
            "buffers": step.buffers,
            "inputs": list(step.inputs),
            "num_inputs": step.num_inputs,
            "loss": f.owner[step.loss],
            "grads": {f.owner[k]: v for k, v in step.grads.items()},
            "buffer_updates": {f.owner[k]: v for k, v in step.buffer_updates.items()},
            "random": random_ids,
            "optimizer": optimizer,
        }
    }
    return check_graph(Graph(tuple(nodes), name=name, meta=meta))


_DISPATCH = {"cpu": "CPU", "cuda": "CUDA"}     # device kind -> dispatch key


def has_kernel(n: torch.fx.Node, kind: str) -> bool:
    """Whether n's op has a kernel for the device kind ("cpu" or "cuda"): an op captured on a GPU may have none on
    the CPU (memory-efficient attention and its backward), one captured on the CPU none on a GPU. True where it
    cannot be told: not an ATen op, or CUDA in a build or on a machine without it."""
    if not isinstance(n.target, torch._ops.OpOverload) or kind not in _DISPATCH or \
            (kind == "cuda" and not torch.cuda.is_available()):
        return True
    return torch._C._dispatch_has_computed_kernel_for_dispatch_key(n.target.name(), _DISPATCH[kind])


def runnable(cost: dict[str, float], n: torch.fx.Node) -> dict[str, float]:
    """`cost` without the device kinds that have no kernel for n's op (`has_kernel`), so no schedule puts it
    there."""
    return {k: s for k, s in cost.items() if has_kernel(n, k)}


def _op_name(n: torch.fx.Node) -> str:
    return str(n.target).removeprefix("aten.")


def _multi_output(n, f: Folding, step, cost_of, kind_of, required, nodes, fx_of, random_ids) -> None:
    """One node per used output; the primary carries the cost and holds the rest as workspace while it runs."""
    outs = f.outputs[n.name]
    vals = {o: next(u for u in n.users if u.name == o).meta["val"] for o in outs}
    ins = _tensor_inputs(n, f.owner)
    primary = f.primary[n.name]
    rnd = is_random(n)
    if rnd:
        random_ids.extend(outs)
    op = _op_name(n)
    others = sum(storage_bytes(vals[o]) for o in outs if o != primary)
    unused = sum(storage_bytes(v) for v in n.meta["val"] if isinstance(v, torch.Tensor)) - \
        sum(storage_bytes(vals[o]) for o in outs)
    nodes.append(Node(primary, op, kind_of(primary), tuple(ins), runnable(cost_of(n), n),
                      storage_bytes(vals[primary]),
                      workspace=others + max(unused, 0), recomputable=not rnd, required=primary in required))
    fx_of[primary] = primary
    zero = {k: 0.0 for k in nodes[-1].cost}
    for o in outs:
        if o != primary:
            nodes.append(Node(o, op, kind_of(o), (primary, *[i for i in ins if i != primary]), zero,
                              storage_bytes(vals[o]), recomputable=False, required=o in required, output_of=primary))
            fx_of[o] = o


def _optimizer_nodes(step: Step, f: Folding, nodes: list[Node], optimizer: str, cost_of) -> list[Node]:
    """The parameter update as graph nodes: SGD reads the parameter and its gradient; Adam also two state tensors.

    The updated parameters become the required results in place of the gradients. Adam's state lives across
    steps: its nodes are required and go with the parameters at the front, so that a schedule in list order
    holds them from the start, as the real optimizer does (listed last, keep-everything's simulated peak of an
    Adam step came out 37% below the eager one).
    """
    if optimizer not in ("sgd", "adam"):
        raise CaptureError(f"unknown optimizer {optimizer!r}", field="optimizer", hint="use sgd or adam")
    by_id = {n.id: i for i, n in enumerate(nodes)}
    param_of = {fqn: ph for ph, fqn in step.params.items()}
    extra: list[Node] = []
    zero = {"cuda": 0.0, "cpu": 0.0}
    for g_fx, fqn in step.grads.items():
        g = f.owner[g_fx]
        p = param_of[fqn]
        pb = nodes[by_id[p]].bytes
        nodes[by_id[g]] = replace(nodes[by_id[g]], required=False)
        ins = [p, g]
        if optimizer == "adam":
            for s in ("exp_avg", "exp_avg_sq"):
                extra.append(Node(f"{s}:{fqn}", f"state {s} {fqn}", "param", (), zero, pb, recomputable=False,
                                  required=True))
                ins.append(extra[-1].id)
        # one fused elementwise pass: read every input, write the parameter
        seconds = cost_of(None, bytes_moved=pb * (len(ins) + 1), flops=0)
        extra.append(Node(f"update:{fqn}", f"{optimizer} update", "optimizer", tuple(ins), seconds, pb,
                          recomputable=False, required=True))
    return extra
