// SPDX-License-Identifier: Apache-2.0
// A GQA attention layer trained with Ulysses sequence parallelism in libtorch: P processes on
// this machine, one c10d::ProcessGroupGloo over a FileStore, the exchanges through
// <ulysses/torch/torch.hpp> (ProcessGroupComm, seq_to_head_autograd / head_to_seq_autograd, whose
// backward sums the partial gradients of replicated kv heads).
//
// Every step checks the distributed run against the same layer run in one process over the whole
// sequence (float64): the loss and every parameter gradient (summed over ranks, as data
// parallelism over the sequence-parallel group would) must agree within --tolerance. Where the
// shapes allow DeepSpeed-Ulysses' own op sequence (S, H and Hkv divisible by P), the forward
// seq->head is also compared, bit for bit, with PyTorch's permute + contiguous +
// all_to_all_single of the same tensors.
//
//   torch_attention [--ranks P] [--seq S] [--batch B] [--heads H] [--kv-heads Hkv] [--head-dim D]
//                   [--embed E] [--steps N] [--tolerance T]
// Without --rank it starts the P processes itself (fork), waits for them and exits with the worst
// status; a child runs with --rank r --store FILE.
#include <sys/wait.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <ulysses/torch/torch.hpp>

#include "cli.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <limits>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

using namespace ulysses;

struct Config {
  int ranks = 2, rank = -1, steps = 3;
  std::int64_t seq = 64, batch = 1, heads = 8, kv_heads = 2, head_dim = 16, embed = 64;
  double tolerance = 1e-9, lr = 0.5;
  std::string store;
};

/// The layer's parameters: q, k, v projections [E, H*D], [E, Hkv*D], [E, Hkv*D]; output [H*D, E].
struct Params {
  at::Tensor wq, wk, wv, wo;
  std::vector<at::Tensor> all() const { return {wq, wk, wv, wo}; }
};

Params init_params(const Config& c) {
  torch::manual_seed(0);  // the same on every rank and in the reference
  auto p = [&](std::int64_t in, std::int64_t out) {
    return (torch::randn({in, out}, torch::kDouble) / std::sqrt(static_cast<double>(in))).requires_grad_(true);
  };
  return {p(c.embed, c.heads * c.head_dim), p(c.embed, c.kv_heads * c.head_dim), p(c.embed, c.kv_heads * c.head_dim),
          p(c.heads * c.head_dim, c.embed)};
}

/// Causal softmax attention of q [B, S, h, D] against k, v [B, S, h, D] (kv heads already matched to
/// the query heads): [B, S, h, D].
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const std::int64_t S = q.size(1), D = q.size(3);
  at::Tensor s = torch::einsum("bshd,bthd->bhst", {q, k}) / std::sqrt(static_cast<double>(D));
  const at::Tensor mask = torch::ones({S, S}, torch::kBool).triu(1);
  s = s.masked_fill(mask, -std::numeric_limits<double>::infinity());
  return torch::einsum("bhst,bthd->bshd", {torch::softmax(s, -1), v});
}

/// The layer in one process over the whole sequence: y = attention(x Wq, x Wk, x Wv) Wo.
at::Tensor reference_forward(const Config& c, const Params& w, const at::Tensor& x) {
  const std::int64_t B = x.size(0), S = x.size(1);
  const at::Tensor q = x.matmul(w.wq).view({B, S, c.heads, c.head_dim});
  const at::Tensor k = x.matmul(w.wk).view({B, S, c.kv_heads, c.head_dim}).repeat_interleave(c.heads / c.kv_heads, 2);
  const at::Tensor v = x.matmul(w.wv).view({B, S, c.kv_heads, c.head_dim}).repeat_interleave(c.heads / c.kv_heads, 2);
  return attention(q, k, v).reshape({B, S, c.heads * c.head_dim}).matmul(w.wo);
}

/// DeepSpeed-Ulysses' seq->head written with PyTorch's ops on the same process group: [B, S/P, h, D]
/// → reshape [B, S/P, P, h/P, D] → permute to [P, S/P, B, h/P, D] → contiguous → all_to_all_single →
/// [P (source), S/P, B, h/P, D] → [B, S, h/P, D].
at::Tensor deepspeed_seq_to_head(c10d::ProcessGroup& pg, const at::Tensor& x, int P) {
  const std::int64_t B = x.size(0), Sr = x.size(1), h = x.size(2), D = x.size(3);
  at::Tensor in = x.reshape({B, Sr, P, h / P, D}).permute({2, 1, 0, 3, 4}).contiguous();
  at::Tensor out = torch::empty_like(in);
  std::vector<std::int64_t> none;
  pg.alltoall_base(out, in, none, none)->wait();
  return out.permute({2, 0, 1, 3, 4}).reshape({B, P * Sr, h / P, D});
}

/// Sums a tensor over the group in place (gradients of the replicated parameters).
void allreduce_sum(c10d::ProcessGroup& pg, at::Tensor& t) {
  std::vector<at::Tensor> v{t};
  pg.allreduce(v)->wait();
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

int run_rank(const Config& c) {
  at::set_num_threads(1);  // P processes share the machine
  auto store = c10::make_intrusive<c10d::FileStore>(c.store, c.ranks);
  auto opts = c10d::ProcessGroupGloo::Options::create();
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, c.rank, c.ranks, opts);
  ProcessGroupComm comm(pg);
  const int P = comm.size(), r = comm.rank();
  const std::int64_t B = c.batch, S = c.seq, D = c.head_dim;

  // The Ulysses plans of the layer: q, k, v in one exchange; o in another. The kv split follows
  // the query split (HeadPolicy::balanced: any H, Hkv, P).
  const AttentionSpecs a = attention_specs<double>(P, {c.heads, c.kv_heads, D}, HeadPolicy::balanced);
  const SeqPartition seq = SeqPartition::balanced(S, P);
  const Plan qkv({P, r}, B, seq, a.qkv());
  const Plan out({P, r}, B, seq, a.out());
  const std::int64_t Sr = seq.local_length(r), Hr = a.query_heads.count(r);
  std::vector<std::int64_t> mine, kv_of_head;  // this rank's tokens; the local kv head of each local query head
  for (std::int64_t i = 0; i < Sr; ++i) mine.push_back(seq.global_token(r, i));
  for (std::int64_t h = 0; h < Hr; ++h) kv_of_head.push_back(a.local_kv_head(r, h));
  const at::Tensor tokens = torch::tensor(mine, torch::kLong), kv_index = torch::tensor(kv_of_head, torch::kLong);

  torch::manual_seed(1);
  const at::Tensor x = torch::randn({B, S, c.embed}, torch::kDouble), target = torch::randn({B, S, c.embed}, torch::kDouble);
  Params w = init_params(c), ref = init_params(c);
  const double norm = static_cast<double>(B * S * c.embed);
  int failures = 0;
  for (int step = 0; step < c.steps; ++step) {
    // ---- distributed: this rank's tokens → seq_to_head → attention on its heads → head_to_seq ----
    const at::Tensor xr = x.index_select(1, tokens), tr = target.index_select(1, tokens);
    const at::Tensor q = xr.matmul(w.wq).view({B, Sr, c.heads, D});
    const at::Tensor k = xr.matmul(w.wk).view({B, Sr, c.kv_heads, D});
    const at::Tensor v = xr.matmul(w.wv).view({B, Sr, c.kv_heads, D});
    const std::vector<at::Tensor> h = seq_to_head_autograd(qkv, comm, {q, k, v});  // [B, S, H_r | Hkv_r, D]
    const at::Tensor o2 = attention(h[0], h[1].index_select(2, kv_index), h[2].index_select(2, kv_index));
    const at::Tensor o = head_to_seq_autograd(out, comm, {o2})[0];  // [B, S_r, H, D]
    const at::Tensor yr = o.reshape({B, Sr, c.heads * D}).matmul(w.wo);
    const at::Tensor loss_r = (yr - tr).pow(2).sum() / norm;
    loss_r.backward();
    at::Tensor loss = loss_r.detach().clone();
    allreduce_sum(*pg, loss);
    for (at::Tensor& p : std::vector<at::Tensor>{w.wq, w.wk, w.wv, w.wo}) {
      at::Tensor g = p.grad();
      allreduce_sum(*pg, g);  // each rank's gradient covers its tokens: their sum is the whole sequence's
    }

    // ---- the same layer in one process over the whole sequence ----
    const at::Tensor ref_loss = (reference_forward(c, ref, x) - target).pow(2).sum() / norm;
    ref_loss.backward();

    double worst = 0;
    const std::vector<at::Tensor> pw = w.all(), pr = ref.all();
    for (std::size_t i = 0; i < pw.size(); ++i) worst = std::max(worst, max_abs_diff(pw[i].grad(), pr[i].grad()));
    const double dloss = std::abs(loss.item<double>() - ref_loss.item<double>());
    const bool ok = dloss <= c.tolerance && worst <= c.tolerance;
    failures += !ok;
    if (r == 0)
      std::printf("step %d: loss %.12f (one process: %.12f, |diff| %.2e); max |gradient diff| over Wq, Wk, Wv, Wo %.2e: %s\n", step,
                  loss.item<double>(), ref_loss.item<double>(), dloss, worst, ok ? "OK" : "FAILED");

    // ---- the forward exchange against PyTorch's own op sequence (DeepSpeed-Ulysses) ----
    if (step == 0) {
      const bool applicable = S % P == 0 && c.heads % P == 0 && c.kv_heads % P == 0;
      if (applicable) {
        const at::Tensor ds[3] = {deepspeed_seq_to_head(*pg, q.detach(), P), deepspeed_seq_to_head(*pg, k.detach(), P),
                                  deepspeed_seq_to_head(*pg, v.detach(), P)};
        bool same = true;
        for (int t = 0; t < 3; ++t) same = same && torch::equal(ds[t], h[static_cast<std::size_t>(t)].detach());
        failures += !same;
        if (r == 0) std::printf("forward seq->head vs PyTorch's permute + contiguous + all_to_all_single: %s\n", same ? "bit-exact (q, k, v)" : "DIFFERENT");
      } else if (r == 0) {
        std::printf("forward seq->head vs PyTorch's op sequence: not applicable (it needs S, H and Hkv divisible by P)\n");
      }
    }

    // ---- SGD on both copies ----
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < pw.size(); ++i) {
      at::Tensor p = pw[i], q2 = pr[i];
      p.sub_(c.lr * p.grad());
      q2.sub_(c.lr * q2.grad());
      p.grad().zero_();
      q2.grad().zero_();
    }
  }
  return failures ? 1 : 0;
}

[[noreturn]] void usage(int code) {
  std::printf(
      "usage: torch_attention [--ranks P] [--seq S] [--batch B] [--heads H] [--kv-heads Hkv] [--head-dim D]\n"
      "                       [--embed E] [--steps N] [--tolerance T]\n"
      "Trains a GQA attention layer (float64) for N steps with Ulysses sequence parallelism over P\n"
      "processes (ProcessGroupGloo, FileStore) and checks loss and gradients against one process.\n"
      "Defaults: P=2, S=64, B=1, H=8, Hkv=2, D=16, E=64, N=3, T=1e-9.\n");
  std::exit(code);
}

Config parse(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&] { return std::string(ulysses_cli::value(argc, argv, i)); };
    auto whole = [&](long long lo) { return ulysses_cli::whole(argc, argv, i, lo, INT_MAX); };
    if (a == "--ranks") c.ranks = static_cast<int>(whole(1));
    else if (a == "--rank") c.rank = static_cast<int>(whole(0));
    else if (a == "--store") c.store = value();
    else if (a == "--seq") c.seq = whole(1);
    else if (a == "--batch") c.batch = whole(1);
    else if (a == "--heads") c.heads = whole(1);
    else if (a == "--kv-heads") c.kv_heads = whole(1);
    else if (a == "--head-dim") c.head_dim = whole(1);
    else if (a == "--embed") c.embed = whole(1);
    else if (a == "--steps") c.steps = static_cast<int>(whole(1));
    else if (a == "--tolerance") c.tolerance = ulysses_cli::real(argc, argv, i, 0);
    else if (a == "--help" || a == "-h") usage(0);
    else {
      std::fprintf(stderr, "unknown argument '%s'\n", a.c_str());
      usage(2);
    }
  }
  if (c.heads % c.kv_heads != 0) {
    std::fprintf(stderr, "--heads must be a multiple of --kv-heads\n");
    std::exit(2);
  }
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  Config c = parse(argc, argv);
  if (c.rank < 0) {  // launcher: P children, before any torch state exists in this process
    const std::string store = "/tmp/ulysses_torch_store_" + std::to_string(getpid());
    std::remove(store.c_str());
    std::printf("torch_attention: H=%lld, Hkv=%lld, D=%lld, E=%lld, B=%lld, S=%lld on P=%d processes (ProcessGroupGloo), float64\n",
                static_cast<long long>(c.heads), static_cast<long long>(c.kv_heads), static_cast<long long>(c.head_dim),
                static_cast<long long>(c.embed), static_cast<long long>(c.batch), static_cast<long long>(c.seq), c.ranks);
    std::fflush(stdout);
    std::vector<pid_t> children;
    for (int r = 0; r < c.ranks; ++r) {
      const pid_t pid = fork();
      if (pid < 0) {
        std::perror("fork");
        return 2;
      }
      if (pid == 0) {
        c.rank = r;
        c.store = store;
        int rc = 2;
        try {
          rc = run_rank(c);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        }
        std::fflush(stdout);
        _exit(rc);
      }
      children.push_back(pid);
    }
    int worst = 0;
    for (pid_t pid : children) {
      int status = 0;
      waitpid(pid, &status, 0);
      worst = std::max(worst, WIFEXITED(status) ? WEXITSTATUS(status) : 3);
    }
    std::remove(store.c_str());
    std::printf("torch_attention: %s\n", worst ? "FAILED" : "OK");
    return worst;
  }
  if (c.store.empty()) {
    std::fprintf(stderr, "--rank needs --store FILE (the FileStore all ranks share)\n");
    return 2;
  }
  try {
    return run_rank(c);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", c.rank, e.what());
    return 2;
  }
}
