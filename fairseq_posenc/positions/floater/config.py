"""FLOATER's flags (:class:`FloaterConfig`) and the checks of the solver settings they choose."""
import math
from dataclasses import dataclass, field
from typing import Optional

from ...compat import PosencError
from ..base import PositionBlocksConfig
from ..float_bounds import floater_dt_range, floater_lr_scale_low, floater_step_range
from ..values import Values

FIXED_STEP_SOLVERS = ("euler", "midpoint", "heun2", "heun3", "rk4", "explicit_adams", "implicit_adams")
ADAPTIVE_SOLVERS = ("dopri5", "dopri8", "bosh3", "fehlberg2", "adaptive_heun")


def default_step(dt: float) -> float:
    """The paper's step of the fixed-step solvers: dt / 5."""
    return dt / 5


#: the order of torchdiffeq's explicit Runge-Kutta methods among the fixed-step solvers: a step of
#: size s multiplies the solution of dp/dt = -LAMBDA p by R(-LAMBDA s), R(z) = sum_{k <= order} z^k / k!
RUNGE_KUTTA_ORDERS = {"euler": 1, "midpoint": 2, "heun2": 2, "heun3": 3, "rk4": 4}


def stability_limit(order: int) -> float:
    """The largest x with |R(-y)| <= 1 for every y in [0, x] (the stability interval of the
    explicit Runge-Kutta method of ``order`` stages and order on the negative real axis: 2 for
    euler and midpoint, 2.51 for heun3, 2.79 for rk4). Past it a step amplifies the decaying mode
    of --floater-dissipation's -LAMBDA p, and the solution grows without bound."""
    def unstable(y):
        return abs(sum((-y) ** k / math.factorial(k) for k in range(order + 1))) > 1

    low = 1e-6
    while not unstable(low + 1e-3):  # the first crossing, then bisection
        low += 1e-3
    high = low + 1e-3
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (low, mid) if unstable(mid) else (mid, high)
    return low



def solver_step(dt: float, solver: str, step: Optional[float], dissipation: float) -> float:
    """The step of the fixed-step solvers: ``step`` (--floater-step), else the paper's dt / 5. A step
    with an adaptive solver is refused, and a --floater-dissipation past the step's stability limit."""
    if solver in ADAPTIVE_SOLVERS and step is not None:
        raise PosencError(f"--floater-step {step:g} would change nothing: --floater-solver {solver} is adaptive "
                          "(it chooses its own steps); the step is for the fixed-step solvers, "
                          + ", ".join(FIXED_STEP_SOLVERS))
    step = step if step is not None else default_step(dt)
    if dissipation and solver in RUNGE_KUTTA_ORDERS:
        limit = stability_limit(RUNGE_KUTTA_ORDERS[solver])
        if dissipation * step > limit:
            raise PosencError(
                f"--floater-dissipation {dissipation:g}: with --floater-step {step:g} ({solver}) LAMBDA x step "
                f"= {dissipation * step:.3g} is past {solver}'s stability limit {limit:.3f}, where the solve "
                f"grows without bound instead of decaying; the largest stable LAMBDA for this step is "
                f"{limit / step:.4g} (or take a smaller --floater-step)")
    return step


@dataclass
class FloaterConfig(PositionBlocksConfig):
    floater_init_from: Optional[str] = field(
        default=None,
        metadata={"label": "warm start", "values": Values(file=True),
                  "help": "floater: warm start from this sinusoidal transformer_posenc or fairseq transformer "
                  "checkpoint of the same size, h's output layer and the initial states at 0 (the vanilla model)"},
    )
    floater_solve_every: int = field(
        default=1,
        metadata={"label": "solve every {}", "values": Values(low=1),
                  "help": "floater: update the flow model (h and the initial states) once per N updates with the mean "
                  "of their gradients, solving once per N updates (Sec. 4.4; docs/floater.md)"},
    )
    floater_lr_scale: Optional[float] = field(
        default=None,
        metadata={"label": "lr scale {}",
                  "values": Values(low=floater_lr_scale_low, why="the weights are stored as W / C in float32"),
                  "help": "floater: h and the initial states learn C times faster under Adam (stored as V, W = C V). "
                  "Default: min(N, 10), N of --floater-solve-every; 1 with --floater-init-from. Saved with the weights"},
    )
    floater_solver: str = field(
        default="rk4", metadata={"label": "solver {}",
                                 "values": Values(choices=FIXED_STEP_SOLVERS + ADAPTIVE_SOLVERS,
                                                  noun="a torchdiffeq method"),
                                 "help": "floater: torchdiffeq method, fixed-step " + ", ".join(FIXED_STEP_SOLVERS)
                                 + " or adaptive " + ", ".join(ADAPTIVE_SOLVERS)}
    )
    floater_step: Optional[float] = field(default=None, metadata={
        "label": "step {}",
        "values": Values(low=lambda args: floater_step_range(args)[0], high=lambda args: floater_step_range(args)[1],
                         why="the solver's grid of steps in float32 and in memory"),
        "help": "floater: step of the fixed-step solvers (default dt / 5; refused with an adaptive solver, which "
                "chooses its own)"})
    floater_dt: float = field(default=0.1, metadata={
        "label": "dt {}", "help": "floater: time between two positions",
        "values": Values(low=lambda args: floater_dt_range(args)[0], high=lambda args: floater_dt_range(args)[1],
                         why="the positions' times i x dt in float32")})
    floater_dissipation: float = field(
        default=0.0,
        metadata={"label": "dissipation {}", "values": Values(low=0, why="0: the paper's FLOATER"),
                  "help": "floater, not in the paper: LAMBDA > 0 solves dp/dt = -LAMBDA p + tanh(h(t, p)), whose "
                  "biases stay within max(|p(0)|, 1 / LAMBDA) per coordinate. 0: the paper's FLOATER"},
    )
    floater_cross_attention: bool = field(
        default=False,
        metadata={"label": "cross-attention",
                  "help": "floater: also bias the keys and values of encoder-decoder attention (the paper, "
                  "Eq. 12, biases self-attention only)"},
    )
    floater_hidden: Optional[int] = field(
        default=None, metadata={"values": Values(low=1),
                                "help": "floater: hidden size of the dynamics h (default: the attention width)"}
    )
    floater_adjoint: bool = field(
        default=False, metadata={"help": "floater: backpropagate with the adjoint method (less memory, more time)"}
    )
