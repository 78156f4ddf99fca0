// SPDX-License-Identifier: Apache-2.0
// Ulysses attention forward on P ranks (DeepSpeed-Ulysses, arXiv:2309.14509):
//   q, k, v seq-sharded [B, S_r, H, D] → seq_to_head (ONE exchange for q, k and v, GQA included)
//   → exact softmax attention over the whole sequence for the rank's heads
//   → head_to_seq of the output → compared with single-rank attention over the whole sequence.
// Runs on the in-process group (P threads, default) or under `mpiexec -n P ... --backend mpi`.
#include <ulysses/ulysses.hpp>
#if ULYSSES_DEMO_MPI
#include <ulysses/comm/mpi.hpp>
#endif
#if ULYSSES_DEMO_CUDA
#include "cuda_backend.hpp"
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "models.hpp"

namespace {

using namespace ulysses;
using Clock = std::chrono::steady_clock;

struct Config {
  int ranks = 4;
  std::int64_t batch = 1, seq = 1024, heads = 32, kv_heads = 8, head_dim = 128, v_head_dim = 128;
  Format layout = Format::bshd;
  std::string model = "Llama-3.1-8B";
  std::string backend = "local";
  std::string device = "cpu";  // --device cuda: redistributions on the GPU (P virtual ranks on one device)
  bool balanced = false;  // head split
  bool ranks_given = false;  // --ranks on the command line (checked against the MPI world size)
  double tolerance = 1e-4;
};

struct Result {  // one rank's measurements
  double max_err = 0, pack_ms = 0, exchange_ms = 0, unpack_ms = 0, attention_ms = 0;
  double bytes_s2h = 0, bytes_h2s = 0;
};

// Deterministic input in [-1, 1): a hash of (tensor, b, s, h, d).
float input_value(int t, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) {
  std::uint64_t x = (((static_cast<std::uint64_t>(t) * 131 + b) * 1000003 + s) * 4099 + h) * 1031 + d;
  x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 33, x *= 0xc4ceb9fe1a85ec53ull, x ^= x >> 33;
  return static_cast<float>((x >> 40) * (1.0 / (1ull << 24)) * 2.0 - 1.0);
}

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

/// Runs the stages redistribute() runs, with per-phase timing: with LocalGroup and MPI, one
/// message per (peer, tensor), in place where contiguous (pack_pieces → exchange_pieces →
/// unpack_pieces); otherwise pack → exchange → unpack.
template <class Comm>
void timed_redistribute(const Plan& plan, Direction dir, Comm& comm, TensorList<const void*> in, TensorList<void*> out,
                        std::vector<std::byte>& ws, Result& res) {
  HostExecutor exec;
  const BufferTable t = make_buffers(plan, dir, in, out, {ws.data(), ws.size()});
  const bool pieces = uses_pieces<Comm, HostExecutor>(plan);
  auto t0 = Clock::now();
  pieces ? pack_pieces(plan, dir, exec, t) : pack(plan, dir, exec, t);
  res.pack_ms += ms_since(t0);
  t0 = Clock::now();
  if constexpr (has_exchange_messages_v<Comm>) {
    if (pieces) exchange_pieces(plan, dir, comm, t);
    else exchange(plan, dir, comm, t);
  } else {
    exchange(plan, dir, comm, t);
  }
  res.exchange_ms += ms_since(t0);
  t0 = Clock::now();
  pieces ? unpack_pieces(plan, dir, exec, t) : unpack(plan, dir, exec, t);
  res.unpack_ms += ms_since(t0);
}

#if ULYSSES_DEMO_CUDA
/// --device cuda: the same three phases on the GPU, timed with CUDA events (cuda_backend.cu).
void timed_redistribute(const Plan& plan, Direction dir, demo_cuda::Rank& comm, TensorList<const void*> in,
                        TensorList<void*> out, std::vector<std::byte>&, Result& res) {
  double ms[3] = {0, 0, 0};
  comm.redistribute(plan, dir, in, out, ms);
  res.pack_ms += ms[0], res.exchange_ms += ms[1], res.unpack_ms += ms[2];
}
#endif

/// Softmax attention of one query row against keys/values given by accessors; Acc is the
/// accumulation type (float for the distributed run, double for the reference).
template <class Acc, class KAt, class VAt>
void attend_row(const float* q, std::int64_t S, std::int64_t D, std::int64_t Dv, KAt k_at, VAt v_at, Acc* scores,
                Acc* out) {
  const Acc scale = Acc(1) / std::sqrt(static_cast<Acc>(D));
  Acc mx = -INFINITY;
  for (std::int64_t j = 0; j < S; ++j) {
    const float* k = k_at(j);
    Acc dot = 0;
    for (std::int64_t d = 0; d < D; ++d) dot += static_cast<Acc>(q[d]) * static_cast<Acc>(k[d]);
    scores[j] = dot * scale;
    mx = std::max(mx, scores[j]);
  }
  Acc sum = 0;
  for (std::int64_t j = 0; j < S; ++j) sum += scores[j] = std::exp(scores[j] - mx);
  for (std::int64_t d = 0; d < Dv; ++d) out[d] = 0;
  for (std::int64_t j = 0; j < S; ++j) {
    const float* v = v_at(j);
    const Acc p = scores[j] / sum;
    for (std::int64_t d = 0; d < Dv; ++d) out[d] += p * static_cast<Acc>(v[d]);
  }
}

/// Gathers rows of a tensor in `l` (d possibly strided) into contiguous float rows: rows[s*D + d].
std::vector<float> rows_of(const std::vector<float>& x, const Layout& l, std::int64_t b, std::int64_t h) {
  std::vector<float> r(static_cast<std::size_t>(l.extent[1] * l.extent[3]));
  for (std::int64_t s = 0; s < l.extent[1]; ++s)
    for (std::int64_t d = 0; d < l.extent[3]; ++d) r[static_cast<std::size_t>(s * l.extent[3] + d)] = x[static_cast<std::size_t>(l.offset(b, s, h, d))];
  return r;
}

template <class Comm>
Result run_rank(Comm& comm, const Config& c) {
  Result res;
  const int P = comm.size(), r = comm.rank();
  const auto seq = SeqPartition::balanced(c.seq, P);
  const auto qh = c.balanced ? HeadPartition::balanced(c.heads, P) : HeadPartition::even(c.heads, P);
  const auto kvh = HeadPartition::gqa(qh, c.kv_heads);
  // q, k, v in one plan (one exchange); the attention output o in another (head→seq).
  Plan qkv({P, r}, c.batch, seq,
           {TensorSpec::of<float>(qh, c.head_dim), TensorSpec::of<float>(kvh, c.head_dim), TensorSpec::of<float>(kvh, c.v_head_dim)},
           c.layout);
  Plan po({P, r}, c.batch, seq, {TensorSpec::of<float>(qh, c.v_head_dim)}, c.layout);
  std::vector<std::byte> ws(std::max(qkv.workspace_bytes(), po.workspace_bytes()));

  // Seq-sharded inputs: this rank's tokens of the global q, k, v.
  std::vector<float> in[3], mid[3];
  const std::int64_t Hs[3] = {c.heads, c.kv_heads, c.kv_heads}, Ds[3] = {c.head_dim, c.head_dim, c.v_head_dim};
  const std::vector<SeqChunk> mine = seq.chunks_of(r);
  for (int t = 0; t < 3; ++t) {
    const Layout& l = qkv.seq_layout(t);
    in[t].resize(qkv.seq_bytes(t) / sizeof(float));
    for (const SeqChunk& ch : mine)
      for (std::int64_t b = 0; b < c.batch; ++b)
        for (std::int64_t s = 0; s < ch.length; ++s)
          for (std::int64_t h = 0; h < Hs[t]; ++h)
            for (std::int64_t d = 0; d < Ds[t]; ++d)
              in[t][static_cast<std::size_t>(l.offset(b, ch.local_offset + s, h, d))] = input_value(t, b, ch.offset + s, h, d);
    mid[t].resize(qkv.head_bytes(t) / sizeof(float));
  }
  timed_redistribute(qkv, Direction::seq_to_head, comm, {in[0].data(), in[1].data(), in[2].data()},
                     {mid[0].data(), mid[1].data(), mid[2].data()}, ws, res);

  // Attention for this rank's query heads over all S tokens; query head h uses kv head h / g.
  auto t0 = Clock::now();
  const std::int64_t S = c.seq, g = c.heads / c.kv_heads, Hr = qh.count(r);
  const Layout &lq = qkv.head_layout(0), &lk = qkv.head_layout(1), &lv = qkv.head_layout(2), &lo = po.head_layout(0);
  std::vector<float> o(po.head_bytes(0) / sizeof(float));
  std::vector<float> scores(static_cast<std::size_t>(S)), row(static_cast<std::size_t>(c.v_head_dim));
  for (std::int64_t b = 0; b < c.batch; ++b)
    for (std::int64_t h = 0; h < Hr; ++h) {
      const std::int64_t kv = (qh.begin(r) + h) / g - kvh.begin(r);
      const auto Q = rows_of(mid[0], lq, b, h), K = rows_of(mid[1], lk, b, kv), V = rows_of(mid[2], lv, b, kv);
      for (std::int64_t i = 0; i < S; ++i) {
        attend_row<float>(&Q[static_cast<std::size_t>(i * c.head_dim)], S, c.head_dim, c.v_head_dim,
                          [&](std::int64_t j) { return &K[static_cast<std::size_t>(j * c.head_dim)]; },
                          [&](std::int64_t j) { return &V[static_cast<std::size_t>(j * c.v_head_dim)]; }, scores.data(), row.data());
        for (std::int64_t d = 0; d < c.v_head_dim; ++d) o[static_cast<std::size_t>(lo.offset(b, i, h, d))] = row[static_cast<std::size_t>(d)];
      }
    }
  res.attention_ms = ms_since(t0);

  std::vector<float> out(po.seq_bytes(0) / sizeof(float));
  timed_redistribute(po, Direction::head_to_seq, comm, {o.data()}, {out.data()}, ws, res);
  res.bytes_s2h = static_cast<double>(qkv.exchanged_bytes(Direction::seq_to_head));
  res.bytes_h2s = static_cast<double>(po.exchanged_bytes(Direction::head_to_seq));

  // Reference: single-rank attention over the whole sequence (double accumulation), evaluated at
  // this rank's tokens, from the global k and v.
  const Layout& ls = po.seq_layout(0);
  std::vector<float> kg(static_cast<std::size_t>(S * c.head_dim)), vg(static_cast<std::size_t>(S * c.v_head_dim)), qrow(static_cast<std::size_t>(c.head_dim));
  std::vector<double> sd(static_cast<std::size_t>(S)), ref(static_cast<std::size_t>(c.v_head_dim));
  for (std::int64_t b = 0; b < c.batch; ++b)
    for (std::int64_t kv = 0; kv < c.kv_heads; ++kv) {
      for (std::int64_t j = 0; j < S; ++j) {
        for (std::int64_t d = 0; d < c.head_dim; ++d) kg[static_cast<std::size_t>(j * c.head_dim + d)] = input_value(1, b, j, kv, d);
        for (std::int64_t d = 0; d < c.v_head_dim; ++d) vg[static_cast<std::size_t>(j * c.v_head_dim + d)] = input_value(2, b, j, kv, d);
      }
      for (std::int64_t h = kv * g; h < (kv + 1) * g; ++h)
        for (const SeqChunk& ch : mine)
          for (std::int64_t s = 0; s < ch.length; ++s) {
            for (std::int64_t d = 0; d < c.head_dim; ++d) qrow[static_cast<std::size_t>(d)] = input_value(0, b, ch.offset + s, h, d);
            attend_row<double>(qrow.data(), S, c.head_dim, c.v_head_dim,
                               [&](std::int64_t j) { return &kg[static_cast<std::size_t>(j * c.head_dim)]; },
                               [&](std::int64_t j) { return &vg[static_cast<std::size_t>(j * c.v_head_dim)]; }, sd.data(), ref.data());
            for (std::int64_t d = 0; d < c.v_head_dim; ++d) {
              const double e = std::abs(ref[static_cast<std::size_t>(d)] - out[static_cast<std::size_t>(ls.offset(b, ch.local_offset + s, h, d))]);
              res.max_err = std::isnan(e) ? INFINITY : std::max(res.max_err, e);
            }
          }
    }
  return res;
}

[[noreturn]] void usage(int code) {
  std::printf(
      "usage: ulysses_attention [--ranks P] [--batch B] [--seq S] [--heads H] [--kv-heads Hkv]\n"
      "                         [--head-dim D] [--v-head-dim Dv] [--layout bshd|sbhd|bhsd]\n"
      "                         [--model NAME] [--balanced] [--tolerance T] [--backend local|mpi]\n"
      "                         [--device cpu|cuda] [--list-models]\n"
      "Ulysses attention forward (fp32) on P ranks; compares with single-rank attention.\n"
      "Default: Llama-3.1-8B attention (H=32, Hkv=8, D=128), B=1, S=1024, P=4, bshd, in-process group.\n"
      "--balanced: split heads with HeadPartition::balanced (H not divisible by P; uneven S needs nothing).\n"
      "--model: a public model's head shapes (S stays 1024 unless --seq); a unique prefix is enough.\n"
      "--backend mpi: run under `mpiexec -n P`; P is the number of MPI processes.\n"
      "--device cuda: q, k, v and o are redistributed on the GPU (P virtual ranks on one device,\n"
      "               CUDA executor + in-process device group); attention stays on the host.\n");
  std::exit(code);
}

Config parse(int argc, char** argv) {
  Config c;
  auto need = [&](int& i) -> const char* {
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s needs a value\n", argv[i]);
      usage(2);
    }
    return argv[++i];
  };
  auto number = [&](int& i) -> long long {  // a whole number, or exit 2 naming the flag
    const char* flag = argv[i];
    const char* v = need(i);
    char* end = nullptr;
    const long long n = std::strtoll(v, &end, 10);
    if (!*v || *end) {
      std::fprintf(stderr, "%s expects a whole number, got '%s'\n", flag, v);
      std::exit(2);
    }
    return n;
  };
  bool ranks_given = false;
  auto apply_model = [&](const std::string& name) {
    const auto* m = ulysses_models::find_model(name);
    if (!m) {
      std::fprintf(stderr, "unknown or ambiguous model '%s'; --list-models lists them\n", name.c_str());
      std::exit(2);
    }
    c.model = m->name, c.heads = m->num_heads, c.kv_heads = m->num_kv_heads, c.head_dim = m->head_dim, c.v_head_dim = m->v_head_dim;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--ranks") c.ranks = static_cast<int>(number(i)), ranks_given = true;
    else if (a == "--batch") c.batch = number(i);
    else if (a == "--seq") c.seq = number(i);
    else if (a == "--heads") c.heads = number(i), c.model = "custom";
    else if (a == "--kv-heads") c.kv_heads = number(i), c.model = "custom";
    else if (a == "--head-dim") c.head_dim = c.v_head_dim = number(i), c.model = "custom";
    else if (a == "--v-head-dim") c.v_head_dim = number(i), c.model = "custom";
    else if (a == "--model") apply_model(need(i));
    else if (a == "--balanced") c.balanced = true;
    else if (a == "--tolerance") c.tolerance = std::atof(need(i));
    else if (a == "--backend") c.backend = need(i);
    else if (a == "--device") c.device = need(i);
    else if (a == "--layout") {
      const std::string l = need(i);
      if (l == "bshd") c.layout = Format::bshd;
      else if (l == "sbhd") c.layout = Format::sbhd;
      else if (l == "bhsd") c.layout = Format::bhsd;
      else {
        std::fprintf(stderr, "--layout must be bshd, sbhd or bhsd, not '%s'\n", l.c_str());
        std::exit(2);
      }
    } else if (a == "--list-models") {
      for (const auto& m : ulysses_models::kModels)
        std::printf("%-18s H=%-3lld Hkv=%-3lld D=%-3lld Dv=%-3lld S=%lld\n", m.name, (long long)m.num_heads, (long long)m.num_kv_heads,
                    (long long)m.head_dim, (long long)m.v_head_dim, (long long)m.typical_seq_len);
      std::exit(0);
    } else if (a == "--help" || a == "-h") usage(0);
    else {
      std::fprintf(stderr, "unknown argument '%s'\n", a.c_str());
      usage(2);
    }
  }
  if (c.backend != "local" && c.backend != "mpi") {
    std::fprintf(stderr, "--backend must be local or mpi, not '%s'\n", c.backend.c_str());
    std::exit(2);
  }
  c.ranks_given = ranks_given;
  if (c.device != "cpu" && c.device != "cuda") usage(2);
  if (c.device == "cuda" && c.backend != "local") {
    std::fprintf(stderr, "--device cuda runs the in-process group (--backend local); use examples/nccl_mpi for MPI + GPUs\n");
    std::exit(2);
  }
  return c;
}

Result reduce_max(const std::vector<Result>& rs) {
  Result m;
  for (const Result& r : rs) {
    m.max_err = std::max(m.max_err, r.max_err), m.pack_ms = std::max(m.pack_ms, r.pack_ms);
    m.exchange_ms = std::max(m.exchange_ms, r.exchange_ms), m.unpack_ms = std::max(m.unpack_ms, r.unpack_ms);
    m.attention_ms = std::max(m.attention_ms, r.attention_ms);
    m.bytes_s2h = std::max(m.bytes_s2h, r.bytes_s2h), m.bytes_h2s = std::max(m.bytes_h2s, r.bytes_h2s);
  }
  return m;
}

int report(const Config& c, int P, const Result& m) {
  std::printf("ulysses attention demo: %s (H=%lld, Hkv=%lld, D=%lld, Dv=%lld), B=%lld, S=%lld, P=%d, fp32, %s, %s backend\n",
              c.model.c_str(), (long long)c.heads, (long long)c.kv_heads, (long long)c.head_dim, (long long)c.v_head_dim,
              (long long)c.batch, (long long)c.seq, P, to_string(c.layout), c.backend == "mpi" ? "MPI" : "in-process");
  if (c.device == "cuda")
    std::printf("  device: CUDA, %d virtual ranks on one GPU (CudaExecutor + DeviceLocalGroup); attention on the host\n", P);
  std::printf("  bytes exchanged per rank: seq->head (q,k,v in one exchange) %.3f MiB, head->seq (o) %.3f MiB\n",
              m.bytes_s2h / (1 << 20), m.bytes_h2s / (1 << 20));
  std::printf("  phase times (max over ranks, both directions): pack %.3f ms, exchange %.3f ms, unpack %.3f ms, attention %.1f ms\n",
              m.pack_ms, m.exchange_ms, m.unpack_ms, m.attention_ms);
  const bool ok = m.max_err <= c.tolerance;
  std::printf("  max abs error vs single-rank attention: %.3g (tolerance %.1g): %s\n", m.max_err, c.tolerance, ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const Config c = parse(argc, argv);
  try {
    if (c.backend == "mpi") {
#if ULYSSES_DEMO_MPI
      MPI_Init(&argc, &argv);
      MpiComm comm(MPI_COMM_WORLD);
      if (c.ranks_given && c.ranks != comm.size()) {
        if (comm.rank() == 0)
          std::fprintf(stderr, "--ranks %d but mpiexec started %d processes; with --backend mpi, P is the number of processes\n",
                       c.ranks, comm.size());
        MPI_Finalize();
        return 2;
      }
      Result r = run_rank(comm, c), m;
      double mine[7] = {r.max_err, r.pack_ms, r.exchange_ms, r.unpack_ms, r.attention_ms, r.bytes_s2h, r.bytes_h2s}, all[7];
      MPI_Allreduce(mine, all, 7, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      m = {all[0], all[1], all[2], all[3], all[4], all[5], all[6]};
      int rc = 0;
      if (comm.rank() == 0) rc = report(c, comm.size(), m);
      MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
      MPI_Finalize();
      return rc;
#else
      std::fprintf(stderr, "this build has no MPI (install libopenmpi-dev and reconfigure)\n");
      return 2;
#endif
    }
    if (c.device == "cuda") {
#if ULYSSES_DEMO_CUDA
      const std::string why = demo_cuda::unavailable();
      if (!why.empty()) {
        std::printf("no CUDA device: skipping --device cuda (%s)\n", why.c_str());
        return 77;  // ctest: skipped
      }
      std::printf("device: %s\n", demo_cuda::device_name().c_str());
      std::vector<Result> rs(static_cast<std::size_t>(c.ranks));
      demo_cuda::run_group(c.ranks, [&](demo_cuda::Rank& comm) { rs[static_cast<std::size_t>(comm.rank())] = run_rank(comm, c); });
      return report(c, c.ranks, reduce_max(rs));
#else
      std::fprintf(stderr, "this build has no CUDA (install the CUDA toolkit and reconfigure)\n");
      return 2;
#endif
    }
    LocalGroup group(c.ranks);
    std::vector<Result> rs(static_cast<std::size_t>(c.ranks));
    group.run([&](LocalGroup::Comm& comm) { rs[static_cast<std::size_t>(comm.rank())] = run_rank(comm, c); });
    return report(c, c.ranks, reduce_max(rs));
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
