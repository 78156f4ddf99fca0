// SPDX-License-Identifier: Apache-2.0
// Ulysses seq→head / head→seq of q, k, v over NCCL, one process per GPU:
//   mpiexec -n <GPUs> nccl_mpi [--seq S] [--heads H] [--kv-heads Hkv] [--head-dim D] [--iters N]
// Rank 0 makes the ncclUniqueId and broadcasts it over MPI (MPI_Bcast); every process takes the
// GPU of its node-local rank, builds the same Plan, and runs pack (CudaExecutor, one launch) →
// NCCL all-to-all-v (NcclComm: grouped ncclSend/ncclRecv) → unpack on one stream. The result is
// checked bit for bit against the values every rank must hold, then timed.
// Without a CUDA device it says so and exits 77 (ctest: skipped).
#include <mpi.h>
#include <nccl.h>

#include <ulysses/ulysses.hpp>
#include <ulysses/comm/nccl.cuh>
#include <ulysses/cuda/executor.cuh>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "mpi_node.hpp"

using namespace ulysses;

namespace {

using elem = std::uint16_t;  // a bf16-sized payload

/// The value of global element (t, s, h, d) (B = 1): a hash of its position, as 16 bits.
elem value(int t, std::int64_t s, std::int64_t h, std::int64_t d) {
  std::uint64_t x = ((static_cast<std::uint64_t>(t) * 1000003 + static_cast<std::uint64_t>(s)) * 4099 + static_cast<std::uint64_t>(h)) * 1031 +
                    static_cast<std::uint64_t>(d);
  x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 33;
  return static_cast<elem>(x);
}

void cuda(cudaError_t e, const char* what) { detail::cuda_check(e, what); }
void nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw Error(Errc::backend, std::string(what) + " failed: " + ncclGetErrorString(r));
}

struct Config {
  std::int64_t seq = 8192, heads = 32, kv_heads = 8, head_dim = 128;
  int iters = 20;
};

Config parse(int argc, char** argv) {
  Config c;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const long long v = std::atoll(argv[i + 1]);
    if (a == "--seq") c.seq = v;
    else if (a == "--heads") c.heads = v;
    else if (a == "--kv-heads") c.kv_heads = v;
    else if (a == "--head-dim") c.head_dim = v;
    else if (a == "--iters") c.iters = static_cast<int>(v);
    else {
      std::fprintf(stderr, "usage: nccl_mpi [--seq S] [--heads H] [--kv-heads Hkv] [--head-dim D] [--iters N]\n");
      std::exit(2);
    }
  }
  return c;
}

/// One process's run; returns 0 when every check passed.
int run(const Config& c, int rank, int P, int local_rank) {
  cuda(cudaSetDevice(local_rank), "cudaSetDevice");
  ncclUniqueId id;
  if (rank == 0) nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t nc;
  nccl(ncclCommInitRank(&nc, P, id, rank), "ncclCommInitRank");
  cudaStream_t s;
  cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  int bad = 0;
  {
    const auto q = HeadPartition::balanced(c.heads, P);
    const auto kv = HeadPartition::gqa(q, c.kv_heads);
    const auto seq = SeqPartition::balanced(c.seq, P);
    // head→seq here is the inverse of seq→head (the round trip is checked): a replicated kv head
    // comes back from its owner (Replicas::owner); a training backward would sum them instead.
    const Plan plan({P, rank}, 1, seq,
                    {TensorSpec::of<elem>(q, c.head_dim), TensorSpec::of<elem>(kv, c.head_dim).with_replicas(Replicas::owner),
                     TensorSpec::of<elem>(kv, c.head_dim).with_replicas(Replicas::owner)});
    const std::int64_t H[3] = {c.heads, c.kv_heads, c.kv_heads}, D = c.head_dim;
    // Device buffers: inputs (seq-sharded), outputs (head-sharded), back (seq-sharded), workspace.
    std::vector<void*> mem;
    auto alloc = [&](std::size_t n) {
      void* p = nullptr;
      cuda(cudaMalloc(&p, n ? n : 1), "cudaMalloc");
      mem.push_back(p);
      return p;
    };
    TensorList<ConstByteSpan> in, mid_in;
    TensorList<ByteSpan> mid, back;
    std::vector<std::vector<elem>> host_in(3);
    for (int t = 0; t < 3; ++t) {
      const Layout& l = plan.seq_layout(t);
      host_in[t].resize(plan.seq_bytes(t) / sizeof(elem));
      for (const SeqChunk& ch : seq.chunks_of(rank))
        for (std::int64_t i = 0; i < ch.length; ++i)
          for (std::int64_t h = 0; h < H[t]; ++h)
            for (std::int64_t d = 0; d < D; ++d)
              host_in[t][static_cast<std::size_t>(l.offset(0, ch.local_offset + i, h, d))] = value(t, ch.offset + i, h, d);
      void* p = alloc(plan.seq_bytes(t));
      cuda(cudaMemcpy(p, host_in[t].data(), plan.seq_bytes(t), cudaMemcpyHostToDevice), "cudaMemcpy");
      in.push_back({p, plan.seq_bytes(t)});
      void* m = alloc(plan.head_bytes(t));
      mid.push_back({m, plan.head_bytes(t)});
      mid_in.push_back({m, plan.head_bytes(t)});
      back.push_back({alloc(plan.seq_bytes(t)), plan.seq_bytes(t)});
    }
    const Workspace ws{alloc(plan.workspace_bytes()), plan.workspace_bytes()};
    NcclComm comm(nc, s);
    CudaExecutor ex(plan, s);

    // Correctness: seq→head equals the global tensor's slice, head→seq gives the input back.
    seq_to_head(plan, comm, ex, in, mid, ws);
    head_to_seq(plan, comm, ex, mid_in, back, ws);
    comm.synchronize();  // the bounded cudaStreamSynchronize: Errc::timeout, not a hang, when a peer stalls
    for (int t = 0; t < 3; ++t) {
      const Layout& hl = plan.head_layout(t);
      const std::int64_t h0 = (t == 0 ? q : kv).begin(rank);
      std::vector<elem> got(plan.head_bytes(t) / sizeof(elem)), round(host_in[t].size());
      cuda(cudaMemcpy(got.data(), mid.data[t].data, plan.head_bytes(t), cudaMemcpyDeviceToHost), "cudaMemcpy");
      cuda(cudaMemcpy(round.data(), back.data[t].data, plan.seq_bytes(t), cudaMemcpyDeviceToHost), "cudaMemcpy");
      for (std::int64_t i = 0; i < c.seq; ++i)
        for (std::int64_t h = 0; h < hl.extent[2]; ++h)
          for (std::int64_t d = 0; d < D; ++d)
            bad += got[static_cast<std::size_t>(hl.offset(0, i, h, d))] != value(t, i, h0 + h, d);
      bad += round != host_in[t];
    }

    // Timing: seq_to_head of q, k, v, averaged over c.iters calls.
    cudaEvent_t a, b;
    cuda(cudaEventCreate(&a), "cudaEventCreate");
    cuda(cudaEventCreate(&b), "cudaEventCreate");
    MPI_Barrier(MPI_COMM_WORLD);
    cuda(cudaEventRecord(a, s), "cudaEventRecord");
    for (int i = 0; i < c.iters; ++i) seq_to_head(plan, comm, ex, in, mid, ws);
    cuda(cudaEventRecord(b, s), "cudaEventRecord");
    cuda(cudaEventSynchronize(b), "cudaEventSynchronize");
    float ms = 0;
    cuda(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
    double mine[2] = {ms / c.iters, static_cast<double>(plan.exchanged_bytes(Direction::seq_to_head))}, worst[2];
    MPI_Reduce(mine, worst, 2, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    int all_bad = 0;
    MPI_Reduce(&bad, &all_bad, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      std::printf("nccl_mpi: P=%d GPUs, NCCL %d, S=%lld H=%lld Hkv=%lld D=%lld (2-byte elements), q/k/v in one exchange\n", P,
                  NCCL_VERSION_CODE, (long long)c.seq, (long long)c.heads, (long long)c.kv_heads, (long long)c.head_dim);
      std::printf("  seq_to_head: %.3f ms (max over ranks), %.3f MiB sent per rank, %.1f GB/s per rank\n", worst[0],
                  worst[1] / (1 << 20), worst[1] / (worst[0] * 1e-3) * 1e-9);
      std::printf("  check (seq_to_head values, head_to_seq round trip): %s\n", all_bad ? "FAILED" : "OK");
    }
    bad = all_bad;
    MPI_Bcast(&bad, 1, MPI_INT, 0, MPI_COMM_WORLD);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    for (void* p : mem) cudaFree(p);
  }
  cudaStreamDestroy(s);
  ncclCommDestroy(nc);
  return bad ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const Config c = parse(argc, argv);
  int rank = 0, P = 1, ndev = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  const ulysses_mpi::NodeRank node = ulysses_mpi::node_rank(MPI_COMM_WORLD);
  const int local_rank = node.rank, local_size = node.size;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess) ndev = 0;
  int fewest = ndev;  // every process must see a GPU of its own
  MPI_Allreduce(&ndev, &fewest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  int rc = 0;
  if (fewest == 0) {
    if (rank == 0) std::printf("no CUDA device: skipping nccl_mpi\n");
    rc = 77;
  } else if (local_size > ndev) {
    if (rank == 0) std::fprintf(stderr, "nccl_mpi: %d processes on a node with %d GPUs; run one process per GPU\n", local_size, ndev);
    rc = 2;
  } else {
    try {
      rc = run(c, rank, P, local_rank);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  MPI_Finalize();
  return rc;
}
