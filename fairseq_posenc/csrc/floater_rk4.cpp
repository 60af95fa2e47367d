// The two step loops of FLOATER's hidden-space rk4 (fairseq_posenc/positions/floater/solver.py,
// _RK4Hidden) in C++. The arithmetic is the Python loops' own, in the same order (except that c is
// added after the matmul rather than inside torch's addmm, which rounds differently); what goes is
// Python's cost per operation: a step is four small matmuls and some twenty elementwise passes
// over a (states x hidden) array, each of which costs the interpreter and torch's dispatcher
// several microseconds, more than the work itself at the sizes a researcher trains. The matmuls
// stay with torch (at::mm_out, the BLAS torch was built with); the elementwise passes are plain
// loops. Everything outside the loops (the grid, the interpolation, the weight gradients' final
// sums) stays in Python, which also keeps the GPU path there.
#include <torch/extension.h>

#include <algorithm>
#include <vector>

namespace {

constexpr float kThird = static_cast<float>(1.0 / 3.0);
// the rk4 (3/8 rule) weights of a step's four evaluations
constexpr double kWeights[4] = {0.125, 0.375, 0.375, 0.125};

void check(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous(), name,
              " must be a contiguous float32 CPU tensor");
}

// The loops index raw memory with sizes taken from one argument (u forward, rs backward) and the
// step count: an argument of any other size would be read or written out of bounds, not refused.
void check_size(const at::Tensor& t, const char* name, at::IntArrayRef expected) {
  TORCH_CHECK(t.sizes() == expected, name, " has size ", t.sizes(), " but must be ", expected);
}

// torch.relu's: NaN < 0 is false, so a NaN passes on (as it does through the Python loops and
// torchdiffeq) instead of silently killing the unit and hiding from fairseq's check of the
// gradients; -0 stays -0 as well.
inline float relu(float v) { return v < 0.f ? 0.f : v; }

// out (rows x cols) = beta out + x (rows x cols) m, with m (cols x cols) or a transposed view of
// it. Through torch's own mm: a direct BLAS call (sgemm_) was measured stalling in its threads for
// seconds on a loaded machine.
void matmul(float* out, const float* x, const at::Tensor& m, int64_t rows, int64_t cols, float beta) {
  const auto options = m.options();
  at::Tensor out_t = at::from_blob(out, {rows, cols}, options);
  const at::Tensor x_t = at::from_blob(const_cast<float*>(x), {rows, cols}, options);
  if (beta == 0.f)
    at::mm_out(out_t, x_t, m);
  else
    at::addmm_out(out_t, out_t, x_t, m, beta, 1);
}

// out = relu(u + x * alpha + b), b broadcast over the rows (Python: torch.add(u, x, alpha=alpha)
// .add_(b).relu_()); x may be null (then out = relu(u + b))
void relu_shift(float* out, const float* u, const float* x, float alpha, const float* b, int64_t rows,
                int64_t cols) {
  for (int64_t s = 0; s < rows; ++s) {
    const int64_t o = s * cols;
    for (int64_t j = 0; j < cols; ++j) {
      float v = x ? u[o + j] + x[o + j] * alpha : u[o + j];
      v = v + b[j];
      out[o + j] = relu(v);
    }
  }
}

}  // namespace

// Steps i = 0 .. N-1 forward. u (states, hidden) is y W1 at the start, updated in place; bias1 and
// c (N, 4, hidden) are b1(t) and b2(t) W1 at each evaluation; m = W2 W1. Writes each evaluation's
// relu(p) into rs (N or 1, 4, states, hidden) and each step's weighted sum of them into
// rho (N, states, hidden).
void forward_steps(at::Tensor u, const at::Tensor& bias1, const at::Tensor& c, const at::Tensor& m,
                   const std::vector<double>& dts, at::Tensor rs, at::Tensor rho) {
  check(u, "u");
  check(bias1, "bias1");
  check(c, "c");
  check(m, "m");
  check(rs, "rs");
  check(rho, "rho");
  TORCH_CHECK(u.dim() == 2, "u must be 2-D (states, hidden), got ", u.sizes());
  const int64_t n = static_cast<int64_t>(dts.size()), states = u.size(0), hidden = u.size(1);
  const int64_t size = states * hidden;
  check_size(bias1, "bias1", {n, 4, hidden});
  check_size(c, "c", {n, 4, hidden});
  check_size(m, "m", {hidden, hidden});
  // every step's evaluations, or (nothing kept for a backward) one step's, overwritten
  check_size(rs, "rs", {rs.dim() > 0 && rs.size(0) == 1 ? 1 : n, 4, states, hidden});
  check_size(rho, "rho", {n, states, hidden});
  const bool store = rs.size(0) == n;
  std::vector<float> q(4 * size), step(size);
  float* U = u.data_ptr<float>();
  float* Q[4] = {q.data(), q.data() + size, q.data() + 2 * size, q.data() + 3 * size};
  float* RS = rs.data_ptr<float>();
  float* P = rho.data_ptr<float>();
  const float* B1 = bias1.data_ptr<float>();
  const float* C = c.data_ptr<float>();
  at::NoGradGuard no_grad;

  for (int64_t i = 0; i < n; ++i) {
    const double h = dts[i];
    float* r = RS + (store ? i : 0) * 4 * size;
    float* R[4] = {r, r + size, r + 2 * size, r + 3 * size};
    const float* b = B1 + i * 4 * hidden;
    // q_k = relu(p_k) M + c_k
    auto evaluate = [&](int k) {
      matmul(Q[k], R[k], m, states, hidden, 0.f);
      const float* ck = C + (i * 4 + k) * hidden;
      for (int64_t s = 0; s < states; ++s)
        for (int64_t j = 0; j < hidden; ++j) Q[k][s * hidden + j] += ck[j];
    };

    relu_shift(R[0], U, nullptr, 0.f, b, states, hidden);
    evaluate(0);
    relu_shift(R[1], U, Q[0], static_cast<float>(h / 3), b + hidden, states, hidden);
    evaluate(1);
    // p3 = u + h (q2 - q1 / 3); p4 = u + h (q1 - q2 + q3)
    for (int64_t e = 0; e < size; ++e) step[e] = Q[1][e] - Q[0][e] * kThird;
    relu_shift(R[2], U, step.data(), static_cast<float>(h), b + 2 * hidden, states, hidden);
    evaluate(2);
    for (int64_t e = 0; e < size; ++e) step[e] = Q[0][e] - Q[1][e] + Q[2][e];
    relu_shift(R[3], U, step.data(), static_cast<float>(h), b + 3 * hidden, states, hidden);
    evaluate(3);

    const float w = static_cast<float>(h * 0.125);
    float* Pi = P + i * size;
    for (int64_t e = 0; e < size; ++e) {
      U[e] = U[e] + (Q[0][e] + 3.f * (Q[1][e] + Q[2][e]) + Q[3][e]) * w;
      Pi[e] = ((R[0][e] + R[3][e]) + 3.f * (R[1][e] + R[2][e])) * w;
    }
  }
}

// The discrete adjoint of forward_steps, steps N-1 .. 0. grad_rho (N, states, hidden) is the
// gradient reaching each step's rho. Accumulates into grad_m (hidden, hidden) and fills grad_c and
// grad_b1 (N, 4, hidden; summed over the states). Returns the gradient on u at the start.
at::Tensor backward_steps(const at::Tensor& rs, const at::Tensor& grad_rho, const at::Tensor& m,
                          const std::vector<double>& dts, int64_t chunk, at::Tensor grad_m, at::Tensor grad_c,
                          at::Tensor grad_b1) {
  check(rs, "rs");
  check(grad_rho, "grad_rho");
  check(m, "m");
  check(grad_m, "grad_m");
  check(grad_c, "grad_c");
  check(grad_b1, "grad_b1");
  TORCH_CHECK(rs.dim() == 4, "rs must be 4-D (steps, 4, states, hidden), got ", rs.sizes());
  const int64_t n = static_cast<int64_t>(dts.size()), states = rs.size(2), hidden = rs.size(3);
  const int64_t size = states * hidden;
  check_size(rs, "rs", {n, 4, states, hidden});
  check_size(grad_rho, "grad_rho", {n, states, hidden});
  check_size(m, "m", {hidden, hidden});
  check_size(grad_m, "grad_m", {hidden, hidden});
  check_size(grad_c, "grad_c", {n, 4, hidden});
  check_size(grad_b1, "grad_b1", {n, 4, hidden});
  TORCH_CHECK(chunk > 0 || n == 0, "chunk must be positive, got ", chunk);  // steps i % chunk
  chunk = std::min(chunk, n);
  at::NoGradGuard no_grad;
  at::Tensor g_q = at::empty({chunk, 4, states, hidden}, rs.options());  // on each q
  at::Tensor g_p = at::empty({chunk, 4, states, hidden}, rs.options());  // on each pre-activation
  at::Tensor adjoint = at::zeros({states, hidden}, rs.options());  // u after the last step: no output
  std::vector<float> g_r(size);
  float* A = adjoint.data_ptr<float>();
  float* GQS = g_q.data_ptr<float>();
  float* GPS = g_p.data_ptr<float>();
  const float* RS = rs.data_ptr<float>();
  const float* GRHO = grad_rho.data_ptr<float>();
  const at::Tensor mt = m.t();

  for (int64_t i = n - 1; i >= 0; --i) {
    const int64_t k = i % chunk;
    const double h = dts[i];
    float* GQ[4];
    float* GP[4];
    const float* R[4];
    for (int s = 0; s < 4; ++s) {
      GQ[s] = GQS + (k * 4 + s) * size;
      GP[s] = GPS + (k * 4 + s) * size;
      R[s] = RS + (i * 4 + s) * size;
    }
    const float* g_rho = GRHO + i * size;
    // p's gradient from q's (already in GQ[stage]), and from rho's through relu(p)
    auto vjp = [&](int stage) {
      const float beta = static_cast<float>(h * kWeights[stage]);
      std::copy(g_rho, g_rho + size, g_r.begin());
      matmul(g_r.data(), GQ[stage], mt, states, hidden, beta);
      // torch's relu backward (threshold_backward): 0 where relu(p) <= 0, which a NaN is not,
      // so its gradient passes as through the Python loops
      for (int64_t e = 0; e < size; ++e) GP[stage][e] = R[stage][e] <= 0.f ? 0.f : g_r[e];
    };
    const float h8 = static_cast<float>(h * 0.125), h38 = static_cast<float>(h * 0.375), hf = static_cast<float>(h);
    // p2 = u + h q1 / 3, p3 = u + h (q2 - q1 / 3), p4 = u + h (q1 - q2 + q3)
    for (int64_t e = 0; e < size; ++e) GQ[3][e] = A[e] * h8;
    vjp(3);
    for (int64_t e = 0; e < size; ++e) GQ[2][e] = A[e] * h38 + GP[3][e] * hf;
    vjp(2);
    for (int64_t e = 0; e < size; ++e) GQ[1][e] = A[e] * h38 + (GP[2][e] - GP[3][e]) * hf;
    vjp(1);
    for (int64_t e = 0; e < size; ++e) GQ[0][e] = GQ[3][e] + (GP[3][e] + (GP[1][e] - GP[2][e]) * kThird) * hf;
    vjp(0);
    for (int64_t e = 0; e < size; ++e) A[e] = A[e] + GP[0][e] + GP[1][e] + GP[2][e] + GP[3][e];

    if (k == 0) {  // the chunk is done: its weight gradients in one matmul
      const int64_t count = std::min(chunk, n - i);
      grad_m.addmm_(rs.narrow(0, i, count).reshape({-1, hidden}).t(), g_q.narrow(0, 0, count).reshape({-1, hidden}));
      grad_c.narrow(0, i, count).copy_(g_q.narrow(0, 0, count).sum(2));
      grad_b1.narrow(0, i, count).copy_(g_p.narrow(0, 0, count).sum(2));
    }
  }
  return adjoint;
}

// Running sums along the first dimension: out[i] = x[0] + ... + x[i] (from the end with reverse).
at::Tensor running_sums(const at::Tensor& x, bool reverse) {
  check(x, "x");
  TORCH_CHECK(x.dim() > 0, "x must have a first dimension to sum along, got ", x.sizes());
  at::Tensor out = at::empty_like(x);
  const int64_t n = x.size(0), row = n ? x.numel() / n : 0;
  const float* X = x.data_ptr<float>();
  float* O = out.data_ptr<float>();
  for (int64_t t = 0; t < n; ++t) {
    const int64_t i = reverse ? n - 1 - t : t, prev = reverse ? i + 1 : i - 1;
    for (int64_t e = 0; e < row; ++e) O[i * row + e] = t ? O[prev * row + e] + X[i * row + e] : X[i * row + e];
  }
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.doc() = "FLOATER's hidden-space rk4 step loops (fairseq_posenc.positions.floater.solver)";
  module.def("forward_steps", &forward_steps, "rk4 steps forward, in hidden space");
  module.def("backward_steps", &backward_steps, "their discrete adjoint");
  module.def("running_sums", &running_sums, "cumulative sums along the first dimension");
}
