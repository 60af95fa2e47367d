"""FLOATER's position encoding: per-block biases on the q, k, v projections from one shared ODE
(:mod:`.ode`), the registry's ``floater``."""
from typing import Tuple

from torch import Tensor

from ...compat import PosencError
from ..base import FROM_CHECKPOINT, PositionEncoding, cast
from .config import FloaterConfig, default_step
from .loading import warm_start
from .ode import FloaterODE
from .schedule import lr_scale


class FloaterPositionEncoding(PositionEncoding):
    """Per-block biases on the q, k, v projections from one shared ODE (see the module doc).

    The encoder's scheme owns the ODE with the initial states of every block of the model; the
    decoder's uses it through :meth:`tie`.
    """

    input_embedding = "sinusoidal"
    config = FloaterConfig
    default_blocks = "all"
    keeps_tables = True

    def __init__(self, cfg, side, num_layers, num_heads, head_dim):
        super().__init__(cfg, side, num_layers, num_heads, head_dim)
        self.width = num_heads * head_dim
        # the blocks with biases in each stack
        only_input = self.position_blocks == "input"
        self.encoder_blocks, self.decoder_blocks = (1, 1) if only_input else (cfg.encoder.layers, cfg.decoder.layers)
        self.cross_attention = bool(getattr(cfg, "floater_cross_attention", False))
        self._ode = None
        if side == "encoder":
            # q, k, v of every self-attention block, and k, v of every encoder-decoder one if asked
            states = 3 * (self.encoder_blocks + self.decoder_blocks) + 2 * self.decoder_blocks * self.cross_attention
            hidden = self.width if cfg.floater_hidden is None else cfg.floater_hidden  # values.py refuses < 1
            self.ode = FloaterODE(states, self.width, hidden, cfg.floater_dt,
                                  cfg.floater_solver, cfg.floater_step, cfg.floater_adjoint,
                                  getattr(cfg, "floater_solve_every", 1), getattr(cfg, "floater_lr_scale", None),
                                  getattr(cfg, "floater_dissipation", 0.0),
                                  warm_start=bool(getattr(cfg, "floater_init_from", None)),
                                  from_checkpoint=bool(getattr(cfg, FROM_CHECKPOINT, False)))

    @classmethod
    def finish_model(cls, model, args):
        super().finish_model(model, args)
        if args.floater_init_from:
            warm_start(model, args.floater_init_from)
            # the warm start is done: a checkpoint of this model must not redo it when reloaded
            args.floater_init_from = None

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        stored = state_dict.get(prefix + "ode.initial")
        if self.side == "encoder" and stored is not None and stored.size(0) != self.ode.initial.size(0):
            crossed = 3 * (self.encoder_blocks + self.decoder_blocks) + 2 * self.decoder_blocks
            if stored.size(0) == crossed and not self.cross_attention:
                # checkpoints of before --floater-cross-attention biased encoder-decoder attention too
                raise PosencError(
                    "this FLOATER checkpoint also biases encoder-decoder attention (5 states per decoder "
                    "layer, the default before --floater-cross-attention existed): load it with "
                    "--model-overrides \"{'floater_cross_attention': True}\"")
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def published_options(self):
        """The paper's step dt / 5 of the model's dt, h as wide as attention, no warm start (the
        flag's default; the paper warm-starts, which the label names), and the lr scale's default
        for the N and the start the weights were trained with (:func:`.schedule.lr_scale`)."""
        ode = self.solver
        published = {**super().published_options(), "floater_hidden": self.width, "floater_init_from": False}
        if getattr(ode, "dynamics", None) is not None:  # the RNN's subclass has no ODE
            published["floater_step"] = default_step(ode.dt)
            published["floater_lr_scale"] = lr_scale(ode._trained_every, None, ode._warm_started)
        return published

    def carried_options(self):
        """N, C and the warm start as the weights were trained with them (the ODE's and the
        dynamics' extra state), and h's width as its weights have it, whatever flags rebuilt the model."""
        ode = self.solver
        carried = {**super().carried_options(), "floater_init_from": ode._warm_started}
        if getattr(ode, "dynamics", None) is not None:
            carried["floater_hidden"] = ode.dynamics.fc1.out_features
            carried["floater_solve_every"] = ode._trained_every
            carried["floater_lr_scale"] = getattr(ode.dynamics, "_trained_scale", ode.lr_scale)
        return carried

    def tie(self, encoder_scheme):
        if self.side == "decoder":
            if encoder_scheme.width != self.width:
                raise PosencError(f"floater needs the same attention width in encoder and decoder, got "
                                 f"{encoder_scheme.width} and {self.width}")
            # a reference, not a submodule: the ODE's parameters belong to the encoder
            self._ode = (encoder_scheme.ode,)

    @property
    def solver(self) -> FloaterODE:
        return self.ode if self.side == "encoder" else self._ode[0]

    def begin_forward(self, tokens, continues=False):
        super().begin_forward(tokens, continues)
        if self.side == "encoder":
            self.solver.new_forward()

    def _span(self, role: str) -> Tuple[int, int]:
        """The states of this stack's ``role`` attention in the ODE's state: [first, end)."""
        encoder, decoder = 3 * self.encoder_blocks, 3 * self.decoder_blocks
        if self.side == "encoder":
            return 0, encoder
        if role == "self":
            return encoder, encoder + decoder
        return encoder + decoder, encoder + decoder + 2 * self.decoder_blocks

    def _state(self, layer: int, role: str, projection: int) -> int:
        """The state of a layer's projection (0, 1, 2: q, k, v), counted within :meth:`_span`."""
        if role == "self":
            return 3 * layer + projection
        return 2 * layer + projection - 1

    def _rows(self, role: str, positions: Tensor, pos, like: Tensor) -> Tuple[Tensor, ...]:
        """This stack's biases for ``role`` attention at ``positions``, one (B or 1, T, H * D)
        tensor per state of :meth:`_span`, gathered once per forward and shared by the layers.
        Unpadded, the positions are a slice of the solution (views, no copy); a padded batch
        gathers (states, B, T, H * D) once. Either way the backward builds one gradient of the
        solution, not one per state."""
        def gather():
            first, end = self._span(role)
            # (L, all states, H * D) -> (states of this span, L, H * D): a view
            solution = self.solver.positions(pos.k_frame.numel(), self._continues)[:, first:end].transpose(0, 1)
            if pos.padded:
                rows = solution[:, positions]  # (states, B, T, H * D)
            else:  # the frame: queries are the last T of the keys, encoder-decoder keys all of them
                start = pos.key[0] if role == "self" else 0
                rows = solution[:, start:start + positions.size(-1)].unsqueeze(1)  # (states, 1, T, H * D)
            return cast(rows, like.dtype).unbind(0)

        return self.shared(("floater", role, pos.padded) + pos.key, gather)

    def _bias(self, rows: Tuple[Tensor, ...], state: int) -> Tensor:
        # (B or 1, T, H * D) -> (B or 1, H, T, D)
        bias = rows[state]
        return bias.view(*bias.shape[:2], self.num_heads, self.head_dim).transpose(1, 2)

    def acts_through(self, hook, role):
        # encoder-decoder attention's keys and values with --floater-cross-attention only
        return super().acts_through(hook, role) and (role == "self" or self.cross_attention)

    def transform_qkv(self, layer, role, q, k, v, pos):
        if layer >= (self.encoder_blocks if self.side == "encoder" else self.decoder_blocks):
            return q, k, v
        if role == "self":
            rows = self._rows(role, pos.q, pos, q)
            return tuple(x + self._bias(rows, self._state(layer, role, i)) for i, x in enumerate((q, k, v)))
        if not self.cross_attention or k is None:  # cached keys and values carry their biases
            return q, k, v
        rows = self._rows(role, pos.k, pos, k)
        return (q,) + tuple(x + self._bias(rows, self._state(layer, role, i)) for i, x in ((1, k), (2, v)))
