"""RNN position encoders (Liu et al., 2020, Table 6): FLOATER with its ODE replaced by a recurrence.

p_{i+1} = RNN(z_i, p_i), z_i the scalar i * dt or the sinusoidal vector of i. Everything else is
FLOATER's, by subclassing :mod:`.floater`: each attention block's own initial states p_0, the
biases p_i on its q, k, v, one unrolled recurrence per forward (per pass, also with
--update-freq: see ``begin_update``) for every block and sentence, the kept solution (stored in the checkpoint, extended from its last
state), and the warm start (``--floater-init-from``).

A layer is an Elman RNN's, tanh(W [x; z_i] + b), x the state p_i (first layer) or the layer below;
the last layer's output is p_{i+1}. With the scalar input a layer is one Linear(d + 1 -> d):
263,168 parameters at d=512 (Table 6's 263.2K), two layers 526,336 (its 526.3K, FLOATER's h).
With the vector input a layer is Linear(2d -> d), 524,800: no number of such layers gives Table
6's 1,050.0K (docs/floater.md).

Why tanh: it is the Elman RNN's; it keeps every p_i in [-1, 1] however far the recurrence runs
(FLOATER's ReLU ODE grows without bound past the training lengths); and its slope at 0 is 1, so
gradients pass a warm start's p = 0 (relu's slope at 0 is 0 in torch: nothing would learn). The
scalar is i * dt as FLOATER's time, not i: with nn.Linear's initialisation (|w| up to
1 / sqrt(d + 1)) w * i saturates the tanh within about a hundred positions.

Cost: the recurrence is unrolled with autograd, one (states x d) x (d x d) matmul and a tanh per
position and layer, in sequence (no parallelism over positions), and its backward keeps every
state: positions x layers x states x d floats. FLOATER's rk4 at its default step makes 40
matmuls a position (5 steps, 4 evaluations of h a step, h's 2 layers): 40 times the 1-layer
RNN's, 20 times the 2-layer's, each through autograd's graph.
"""
import dataclasses
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from fairseq.dataclass import ChoiceEnum
from fairseq.modules.sinusoidal_positional_embedding import SinusoidalPositionalEmbedding
from torch import Tensor

from ..compat import PosencError
from .base import at_least_float32
from .floater import FloaterConfig, FloaterODE, FloaterPositionEncoding
from .values import Values

INPUTS = ("scalar", "vector")


@dataclass
class RNNConfig:
    rnn_layers: int = field(
        default=1, metadata={"values": Values(low=1, high=2, why="Table 6's forms"),
                             "help": "rnn: layers of the step p_i -> p_{i+1}, 1 or 2, each tanh(W [x; z_i] + b) "
                             "with x the state or the layer below"})
    rnn_input: ChoiceEnum(list(INPUTS)) = field(
        default="scalar", metadata={"help": "rnn: the input z_i, the scalar i * --rnn-dt or the sinusoidal vector of i"})
    rnn_dt: float = field(
        default=0.1, metadata={"values": Values(low=0, above=True),
                               "help": "rnn: the scalar input's step between positions (FLOATER's dt)"})


class Layer(nn.Module):
    """tanh(x W^T + z U^T + b) = tanh([W U] [x; z] + b): one Linear(d + inputs -> d), its weight on
    z apart (``z``) so that the input terms of all positions are computed before the loop."""

    def __init__(self, dim: int, inputs: int):
        super().__init__()
        self.fc = nn.Linear(dim, dim)
        self.z = nn.Linear(inputs, dim, bias=False)
        bound = 1 / (dim + inputs) ** 0.5  # nn.Linear's initialisation of the whole Linear(d + inputs -> d)
        for p in self.parameters():
            nn.init.uniform_(p, -bound, bound)


class RNNPositions(FloaterODE):
    """FLOATER's ODE solution (``positions(n)``, kept, extended, checkpointed) from a recurrence."""

    def __init__(self, num_states: int, dim: int, layers: int, vector: bool, dt: float, warm_start: bool = False):
        # FLOATER's machinery around a placeholder ODE of one hidden unit, whose dynamics are then
        # dropped: FloaterODE.__init__ builds them, with no hook to build something else
        super().__init__(num_states, dim, 1, dt, "rk4", None, False, warm_start=warm_start)
        del self.dynamics
        self.vector = vector
        self.layers = nn.ModuleList(Layer(dim, dim if vector else 1) for _ in range(layers))

    def reset_to_vanilla(self):
        """Every p_i = 0: zero initial states, and p_{i+1} = 0 whenever p_i = 0. Zeroed are the last
        layer's bias and its weights on all but the state: on z_i, and in the 2-layer form on the
        first layer's output (FLOATER's output layer). What stays random multiplies a zero state or
        feeds the zeroed layer, and tanh'(0) = 1: the zeroed weights learn from the first update
        (z_i and the first layer's output are not 0), the rest from the second."""
        last = self.layers[-1]
        zeroed = [self.initial, last.z.weight, last.fc.bias] + ([last.fc.weight] if len(self.layers) > 1 else [])
        with torch.no_grad():
            for p in zeroed:
                p.zero_()

    def begin_update(self, passes: int):
        """A solve per pass, not FLOATER's one per update: the recurrence costs one matmul per
        position and layer (FLOATER's rk4 twenty), and per-pass gradients add up as every other
        encoding's do, so that two DDP ranks train bit for bit as one process with --update-freq 2
        (tests/fairseq/test_distributed.py; one backward of the summed gradients rounds differently)."""

    def inputs(self, start: int, end: int, device, dtype) -> Tensor:
        """z_i for i in start .. end - 1: (end - start, 1 or d)."""
        if self.vector:
            return SinusoidalPositionalEmbedding.get_embedding(end, self.initial.size(1))[start:].to(device, dtype)
        return (torch.arange(start, end, device=device, dtype=torch.float32) * self.dt).to(dtype)[:, None]

    def _solve(self, y0: Tensor, start: int, end: int) -> Tensor:
        """p at positions start .. end - 1 from p_start = y0: (end - start, states, d), in float32
        whatever the parameters' dtype, as FLOATER's solve."""
        dtype = at_least_float32(y0.dtype)
        p = y0.to(dtype)
        if end - start <= 1:
            return p[None]
        with torch.autocast(device_type=p.device.type, enabled=False):
            z = self.inputs(start, end - 1, p.device, dtype)
            steps = []
            for layer in self.layers:
                u = layer.z.weight.to(dtype).t()
                # elementwise for the scalar: the same rows whatever the range, so an extension is exact
                terms = torch.addmm(layer.fc.bias.to(dtype), z, u) if self.vector else layer.fc.bias.to(dtype) + z * u
                steps.append((layer.fc.weight.to(dtype).t(), terms))
            out = [p]
            for i in range(end - 1 - start):
                for weight, terms in steps:
                    p = torch.tanh(torch.addmm(terms[i], p, weight))
                out.append(p)
        return torch.stack(out)


#: FLOATER's flags the RNN uses; its others are the ODE's (solver, step, dt, h's size, Sec. 4.4's
#: schedule): every flag is in one parser, so an rnn model would accept them and train without them
USED_FLOATER_FLAGS = ("position_blocks", "floater_init_from", "floater_cross_attention")


def _refuse_unused_flags(cfg):
    for f in dataclasses.fields(FloaterConfig):
        value = getattr(cfg, f.name, f.default)
        if f.name not in USED_FLOATER_FLAGS and value != f.default:
            raise PosencError(f"--{f.name.replace('_', '-')} {value}: --position-encoding rnn has no ODE, the flag would "
                              f"be ignored (it takes --floater-init-from, --floater-cross-attention, --position-blocks "
                              f"and the --rnn-* flags)")
    if getattr(cfg, "rnn_input", "scalar") == "vector" and getattr(cfg, "rnn_dt", 0.1) != 0.1:
        raise PosencError(f"--rnn-dt {cfg.rnn_dt}: it scales the scalar input, --rnn-input vector has none")


class RNNPositionEncoding(FloaterPositionEncoding):
    """FLOATER's biases (the same blocks, states and warm start) from :class:`RNNPositions`."""

    #: the flags it takes: its own and the FLOATER flags it uses (models/config.py refuses a flag
    #: no config of the model declares; FLOATER's ODE flags are refused here, saying why)
    config = dataclasses.make_dataclass(
        "RNNFlags", [(f.name, f.type, field(default=f.default, metadata=f.metadata))
                     for f in dataclasses.fields(FloaterConfig) if f.name in USED_FLOATER_FLAGS], bases=(RNNConfig,))

    def __init__(self, cfg, side, num_layers, num_heads, head_dim):
        _refuse_unused_flags(cfg)
        super().__init__(cfg, side, num_layers, num_heads, head_dim)
        if side == "encoder":  # in place of the ODE FLOATER built, for as many block states
            self.ode = RNNPositions(self.ode.initial.size(0), self.width, cfg.rnn_layers, cfg.rnn_input == "vector",
                                    cfg.rnn_dt, warm_start=bool(getattr(cfg, "floater_init_from", None)))
