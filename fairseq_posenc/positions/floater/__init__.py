"""FLOATER (Liu et al., 2020): positions as the solution of a learned ODE.

dp/dt = h(t, p(t)), p_i = p(i * dt); with ``--floater-dissipation LAMBDA`` (not in the paper)
dp/dt = -LAMBDA p + tanh(h(t, p)), whose every coordinate stays within max(|p(0)|, 1 / LAMBDA).
Every attention block has its own initial states (one per projection: q, k, v in
self-attention, k, v in encoder-decoder attention); the dynamics h are
shared by all blocks. The solution is a bias added to the projections, in the paper's
warm-start form: the sinusoidal input embedding stays, and with h = 0 and zero initial states
the model is exactly the vanilla Transformer.

``--position-blocks input`` (Table 2's "only at input block" rows, p^(n) = 0 for n >= 2): the
biases of the first block of the encoder and of the decoder only, with initial states for those
blocks only. Through Eq. 12 FLOATER's p^(1) reaches block 1 as biases on its projections; the
residual stream keeps the sinusoidal input embedding, as at every block in the default form.

One job a file: ``config`` (the flags and their checks), ``dynamics`` (h), ``solver`` and ``loops``
(the solve: FLOATER's own rk4 and its step loops), ``ode`` (the ODE and its kept solution),
``update`` (the passes of one update), ``schedule`` (``--floater-solve-every``), ``loading`` (the lr
scale on load, the warm start) and ``encoding`` (the registry's ``floater``).
"""
from .config import FloaterConfig, default_step, stability_limit
from .dynamics import Dynamics, Float32Field
from .encoding import FloaterPositionEncoding
from .loading import warm_start
from .ode import FloaterODE

__all__ = ["Dynamics", "Float32Field", "FloaterConfig", "FloaterODE", "FloaterPositionEncoding", "default_step",
           "stability_limit", "warm_start"]
