"""What the position schemes add to attention, found without their code paths: the terms a model's
attention adds in its own forward (q, k, v after the position scheme minus before it; the logits'
bias as attention receives it), and FLOATER's and the RNN's positions p_i computed from the
equations written out here (float64), for the tests to compare with what the schemes and
scripts/plot_positions.py report."""
import copy

import torch
from fairseq.modules import SinusoidalPositionalEmbedding
from torchdiffeq import odeint

U32 = 2.0**-24  # float32 unit roundoff


@torch.no_grad()
def biases_in_a_forward(model, n):
    """(side, role, layer) -> ((q, k, v) terms, bound): what the model's attention adds to each
    projection in a forward over n tokens, (T, H * D) each (None for a projection left alone), and
    a bound on the rounding of the difference. On a deep copy, which keeps nothing (a solution
    kept by ``model`` is not reused); recorded at the attention modules' own calls."""
    model = copy.deepcopy(model).eval()
    found = {}
    for side, stack in (("encoder", model.encoder), ("decoder", model.decoder)):
        scheme = stack.position_encoding
        transform = scheme.transform_qkv

        def recorded(layer, role, q, k, v, pos, side=side, transform=transform):
            out = transform(layer, role, q, k, v, pos)
            terms = tuple(None if b is a else (b - a)[0].transpose(0, 1).reshape(b.size(2), -1)
                          for a, b in zip((q, k, v), out))
            bound = 2 * U32 * max(x.abs().max().item() for x in (q, k, v, *out) if x is not None)
            found[side, role, layer] = terms, bound
            return out

        scheme.transform_qkv = recorded  # the instance the attention modules call
    tokens = torch.full((1, n), model.encoder.dictionary.nspecial, dtype=torch.long)
    encoder_out = model.encoder(tokens, torch.tensor([n]))
    model.decoder(tokens, encoder_out=encoder_out)
    return found


@torch.no_grad()
def attention_biases_in_a_forward(model, n):
    """(side, layer) -> the (H, n, n) bias the model's self-attention adds to its logits in a
    forward over n tokens, recorded at the attention modules' own calls (on a deep copy)."""
    model = copy.deepcopy(model).eval()
    found = {}
    for side, stack in (("encoder", model.encoder), ("decoder", model.decoder)):
        scheme = stack.position_encoding
        hook = scheme.attention_bias

        def recorded(layer, q, pos, side=side, hook=hook, heads=scheme.num_heads):
            bias = hook(layer, q, pos)
            if bias is not None:
                found[side, layer] = bias[0].expand(heads, n, n).clone()
            return bias

        scheme.attention_bias = recorded
    tokens = torch.full((1, n), model.encoder.dictionary.nspecial, dtype=torch.long)
    encoder_out = model.encoder(tokens, torch.tensor([n]))
    model.decoder(tokens, encoder_out=encoder_out)
    return found


@torch.no_grad()
def solved_positions(ode, n):
    """p_0 .. p_(n-1) of every state, (n, states, d) in float64, from the equations:
    FLOATER dp/dt = W2 relu(W1 p + b1 + t time1) + b2 + t time2 at t = i dt (a tight adaptive
    solve, not the scheme's rk4); the RNN p_(i+1) = tanh(W [x; z_i] + b) per layer, z_i = i dt or
    the sinusoid of i."""
    d = torch.float64
    if hasattr(ode, "layers"):
        if ode.vector:  # fairseq's input sinusoid of i
            z = SinusoidalPositionalEmbedding.get_embedding(n, ode.initial.size(1)).to(d)
        else:
            z = torch.arange(n, dtype=d)[:, None] * ode.dt
        p = ode.initial.to(d)
        out = [p]
        for i in range(n - 1):
            for layer in ode.layers:
                p = torch.tanh(p @ layer.fc.weight.to(d).t() + layer.fc.bias.to(d) + z[i] @ layer.z.weight.to(d).t())
            out.append(p)
        return torch.stack(out)
    h = ode.dynamics
    assert not getattr(h, "dissipation", 0)
    c = ode.lr_scale
    w1, b1, t1, w2, b2, t2 = (w.to(d) * c for w in (h.fc1.weight, h.fc1.bias, h.time1, h.fc2.weight, h.fc2.bias,
                                                    h.time2))

    def field(t, p):
        return torch.relu(p @ w1.t() + b1 + t * t1) @ w2.t() + b2 + t * t2

    times = torch.arange(n, dtype=d) * ode.dt
    return odeint(field, ode.initial.to(d) * c, times, method="dopri5", rtol=1e-10, atol=1e-12)


def floater_state(scheme, side, role, layer, projection):
    """FLOATER's layout of the states, written out: the encoder's blocks, q k v each, then the
    decoder's self-attention blocks, then (--floater-cross-attention) its cross-attention k v."""
    encoder, decoder = scheme.encoder_blocks, scheme.decoder_blocks
    if side == "encoder":
        return 3 * layer + projection
    if role == "self":
        return 3 * encoder + 3 * layer + projection
    return 3 * encoder + 3 * decoder + 2 * layer + projection - 1
