// SPDX-License-Identifier: Apache-2.0
// The exchanges checked bit for bit on a whole MPI world (built with smpicxx and run by smpirun on
// a simulated cluster: bench/smpi/smpi.sh check; it builds and runs under mpicxx / mpiexec too).
// Real data, no memory folding. The cases are the MPI test's shared list (tests/support), on one
// group of all W ranks:
//   flat      every model of the shared list (scaled-down uneven S = 3W - 1, even heads where they
//             divide, else balanced; GQA kv heads replicated when Hkv < W, summed by head->seq), on
//             MPI_Alltoallv and on the message path (MPI_Isend / MPI_Irecv);
//   two-level two_level_cases(): GQA q/k/v with replicated kv heads, uneven S and H, zigzag, B = 2,
//             K = 2 stages plain and pipelined, lanes 1, 0 (rail-aligned) and 2, on the platform's
//             nodes (W / R nodes of R ranks) and on the test's other node layouts of W ranks;
//   backward  seq_to_head_backward against the sum of every holder's partial gradient in ascending
//             rank order (fp32 and bf16), with the adjoint identity <S x, y> = <x, S^T y> over the
//             world, uneven S and H, flat and two-level (lanes 1 and 0);
//   split     the message path and the two-level one with a per-message limit below the chunks.
//
//   exchange_check [--ranks-per-node R] [--quick | --inject-fault]
//     R: the platform's GPUs a node (default 8); --quick: the CI subset; --inject-fault: rank 1
//     flips one received bit in every exchange, and every case must then fail (the check's check).
// Prints one line per group of cases and "exchange_check: N cases, 0 failed OK" (exit 0), or the
// failures and "FAILED" (exit 1). Every rank takes part in every case.
#include <ulysses/comm/mpi.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cases.hpp"

using namespace ulysses;

namespace {

/// --inject-fault: MpiComm whose rank 1 flips one bit of the first byte it receives from a peer
/// in every exchange (the check must then fail: it checks itself).
class FaultyComm : public MpiComm {
 public:
  using MpiComm::MpiComm;
  void alltoallv(const std::byte* send, const std::size_t* send_bytes, const std::size_t* send_offsets, std::byte* recv,
                 const std::size_t* recv_bytes, const std::size_t* recv_offsets) {
    MpiComm::alltoallv(send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets);
    if (rank() != 1) return;
    for (int p = 0; p < size(); ++p)
      if (p != rank() && recv_bytes[p] > 0) {
        recv[recv_offsets[p]] ^= std::byte{1};
        return;
      }
  }
  void exchange_messages(const Message* send, std::size_t n_send, const Message* recv, std::size_t n_recv) {
    MpiComm::exchange_messages(send, n_send, recv, n_recv);
    if (rank() != 1) return;
    for (std::size_t i = 0; i < n_recv; ++i)
      if (recv[i].bytes > 0) {
        recv[i].data[0] ^= std::byte{1};
        return;
      }
  }
};

struct Tally {
  int cases = 0, failed = 0;
  std::vector<std::string> first;  // rank 0's view of the first failures
};

/// One case on every rank: `err` is this rank's verdict; the world agrees on pass / fail.
void record(Tally& t, const std::string& group, const std::string& name, const std::string& err, MPI_Comm world) {
  int bad = err.empty() ? 0 : 1, any = 0, r = 0;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, world);
  MPI_Comm_rank(world, &r);
  ++t.cases;
  if (!any) return;
  ++t.failed;
  // The failure text of the lowest failing rank reaches rank 0.
  int who = bad ? r : 1 << 30, lowest = 0;
  MPI_Allreduce(&who, &lowest, 1, MPI_INT, MPI_MIN, world);
  char msg[512] = {};
  if (r == lowest) std::snprintf(msg, sizeof msg, "%s", err.c_str());
  if (lowest != 0) {
    if (r == lowest) MPI_Send(msg, sizeof msg, MPI_CHAR, 0, 7, world);
    if (r == 0) MPI_Recv(msg, sizeof msg, MPI_CHAR, lowest, 7, world, MPI_STATUS_IGNORE);
  }
  if (r == 0 && t.first.size() < 20) t.first.push_back(group + ": " + (msg[0] ? std::string(msg) : name));
}

template <class T, class Comm>
std::string guarded(Tally& t, const std::string& group, const ut::Case& c, Comm& comm, MPI_Comm world) {
  std::string err;
  try {
    err = ut::run_case<T>(comm, c);
  } catch (const std::exception& e) {  // a planning error is the same on every rank
    err = std::string("threw: ") + e.what();
  }
  record(t, group, c.name, err, world);
  return err;
}

/// The adjoint check of case c (every rank): exact sums and <S x, y> == <x, S^T y> over the world.
template <class T>
void adjoint(Tally& t, const std::string& group, const ut::Case& c, MpiComm& comm, MPI_Comm world) {
  std::string err;
  long long mine[2] = {0, 0}, sum[2] = {0, 0};
  try {
    const ut::AdjointShare s = ut::run_adjoint_case<T>(comm, c);
    err = s.error;
    mine[0] = s.forward;
    mine[1] = s.backward;
  } catch (const std::exception& e) {
    err = std::string("threw: ") + e.what();
  }
  MPI_Allreduce(mine, sum, 2, MPI_LONG_LONG, MPI_SUM, world);
  if (err.empty() && sum[0] != sum[1]) err = "<S x, y> = " + std::to_string(sum[0]) + " but <x, S^T y> = " + std::to_string(sum[1]);
  record(t, group, c.name, err, world);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int W = 0, w = 0, R = 8;
  bool quick = false, fault = false;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  MPI_Comm_rank(MPI_COMM_WORLD, &w);
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--ranks-per-node") && i + 1 < argc) R = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--inject-fault")) fault = true;
    else {
      if (w == 0) std::fprintf(stderr, "usage: exchange_check [--ranks-per-node R] [--quick | --inject-fault]\n");
      MPI_Finalize();
      return 2;
    }
  }
  if (R < 1 || W % R != 0) {
    if (w == 0) std::fprintf(stderr, "exchange_check: %d ranks are not whole nodes of --ranks-per-node %d\n", W, R);
    MPI_Finalize();
    return 2;
  }
  MPI_Comm world;
  MPI_Comm_dup(MPI_COMM_WORLD, &world);
  MpiComm comm(world);
  Tally t;
  const NodeLayout platform = NodeLayout::uniform(W, R);
  auto done = [&](const char* group, int before, int failed_before) {
    if (w == 0)
      std::printf("  %-62s %4d cases, %d failed\n", group, t.cases - before, t.failed - failed_before);
    std::fflush(stdout);
  };
  if (fault) {  // the check of the check: one flipped bit on rank 1, on every path
    FaultyComm bad(world);
    if (w == 0) std::printf("# exchange_check --inject-fault: %d ranks, rank 1 flips a received bit; every case must fail\n", W);
    ut::Case c = ut::model_case(*ulysses_models::find_model("Llama-3.1-70B"), W, W <= 64 && 64 % W == 0);
    for (Path path : ut::host_paths<FaultyComm>()) {
      c.path = path;
      ut::Case named = c;
      named.name += std::string(" ") + to_string(path);
      guarded<ut::bf16_t>(t, "fault", named, bad, world);
    }
    ut::Case tl = ut::two_level_cases(W, Path::two_level).front();
    tl.nodes = platform;
    tl.name = "two-level on the platform's nodes " + platform.str() + " qkv GQA";
    guarded<float>(t, "fault", tl, bad, world);
    if (w == 0) {
      for (const std::string& s : t.first) std::printf("  detected: %.150s\n", s.c_str());
      std::printf("exchange_check --inject-fault: the fault detected in %d of %d cases%s\n", t.failed, t.cases,
                  t.failed == t.cases ? " (all: the check sees it)" : " BLIND");
    }
    MPI_Comm_free(&world);
    MPI_Finalize();
    return t.failed ? 1 : 0;  // as the plain check: exit 1 when a case failed (CI expects 1 here)
  }
  if (w == 0)
    std::printf("# exchange_check: %d ranks, nodes of %d %s, every element compared bit for bit%s\n", W, R, platform.str().c_str(),
                quick ? " (--quick)" : "");

  // ---- flat: the models sweep on both flat paths --------------------------------------------
  {
    const int c0 = t.cases, f0 = t.failed;
    for (const auto& m : ulysses_models::kModels) {
      if (quick && std::string(m.name) != "Llama-3.1-70B" && std::string(m.name) != "Falcon-7B") continue;
      const bool even = ut::expected_even_error(m, W) == Errc{};
      ut::Case c = ut::model_case(m, W, even);
      for (Path path : ut::host_paths<MpiComm>()) {
        c.path = path;
        ut::Case named = c;
        named.name += std::string(" ") + to_string(path);
        guarded<ut::bf16_t>(t, "flat", named, comm, world);
      }
    }
    done("flat: models, uneven S, GQA (alltoallv, messages)", c0, f0);
  }

  // ---- two-level: the platform's nodes, then the test's other layouts ------------------------
  {
    const int c0 = t.cases, f0 = t.failed;
    std::vector<ut::Case> cases;
    for (ut::Case c : ut::two_level_cases(W, Path::two_level)) {  // their first layout, on the platform's nodes
      if (c.nodes.str() != ut::node_layouts(W).front().second.str()) continue;
      c.nodes = platform;
      c.name = "on the platform's nodes " + platform.str() + ": " + c.name;
      cases.push_back(c);
    }
    if (!quick)
      for (const ut::Case& c : ut::two_level_cases(W, Path::two_level)) cases.push_back(c);
    for (const ut::Case& c : cases) guarded<float>(t, "two-level", c, comm, world);
    done(quick ? "two-level: the platform's nodes" : "two-level: the platform's nodes and the test's layouts", c0, f0);
  }

  // ---- backward: the summed gradients of replicated kv heads ---------------------------------
  {
    const int c0 = t.cases, f0 = t.failed;
    const ulysses_models::Model* m = ulysses_models::find_model("Llama-3.1-70B");  // Hkv = 8: replicated past 8 ranks
    const bool even = m->num_heads % W == 0;                 // Llama-3.1-70B's 64 heads split evenly
    auto q = HeadPartition::balanced(m->num_heads + 3, W);  // uneven H
    auto kv = HeadPartition::gqa(q, 1);                      // one kv head on every rank: MQA
    auto qe = even ? HeadPartition::even(m->num_heads, W) : q;
    auto kve = even ? HeadPartition::gqa(qe, m->num_kv_heads) : kv;
    struct Variant {
      std::string name;
      Path path;
      NodeLayout nodes;
      int lanes;
    };
    std::vector<Variant> vs = {{"alltoallv", Path::alltoallv, {}, 1}, {"messages", Path::messages, {}, 1},
                               {"two-level", Path::two_level, platform, 1}, {"rail", Path::two_level, platform, 0}};
    for (const Variant& v : vs)
      for (int shape = 0; shape < 2; ++shape) {
        ut::Case c = shape == 0 ? ut::Case{"GQA Llama-3.1-70B uneven S", W, 1, SeqPartition::balanced(3 * W + 1, W),
                                           {{qe, 4}, {kve, 4}, {kve, 2}}, Format::bshd}
                                : ut::Case{"MQA uneven S and H", W, 2, SeqPartition::balanced(2 * W - 1, W),
                                           {{q, 3}, {kv, 3}, {kv, 2}}, Format::sbhd};
        if (shape == 0 && !even) continue;
        c.path = v.path;
        c.nodes = v.nodes;
        c.lanes = v.lanes;
        c.name += " " + v.name;
        adjoint<float>(t, "backward", c, comm, world);
        if (!quick || shape == 0) {
          c.name += " bf16";
          adjoint<ut::bf16v>(t, "backward", c, comm, world);
        }
      }
    done("backward: summed kv-head gradients, fp32 and bf16", c0, f0);
  }

  // ---- split: chunks over a lowered per-message limit ---------------------------------------
  {
    const int c0 = t.cases, f0 = t.failed;
    MpiComm small(world, 24);
    ut::Case c = ut::model_case(*ulysses_models::find_model("Llama-3.1-70B"), W, ut::expected_even_error(*ulysses_models::find_model("Llama-3.1-70B"), W) == Errc{});
    c.tensors = {{c.tensors[0].heads, 4}, {c.tensors[1].heads, 4}, {c.tensors[2].heads, 2}};
    for (Path path : ut::host_paths<MpiComm>()) {
      c.path = path;
      ut::Case named = c;
      named.name += std::string(" split ") + to_string(path);
      guarded<float>(t, "split", named, small, world);
    }
    ut::Case tl = ut::two_level_cases(W, Path::two_level).front();
    tl.nodes = platform;
    tl.name = "two-level on the platform's nodes " + platform.str() + " qkv GQA split";
    guarded<float>(t, "split", tl, small, world);
    done("split: a 24-byte message limit (flat and two-level)", c0, f0);
  }

  if (w == 0) {
    for (const std::string& s : t.first) std::printf("FAILED %s\n", s.c_str());
    std::printf("exchange_check: %d cases, %d failed %s\n", t.cases, t.failed, t.failed ? "FAILED" : "OK");
  }
  MPI_Comm_free(&world);
  MPI_Finalize();
  return t.failed ? 1 : 0;
}
