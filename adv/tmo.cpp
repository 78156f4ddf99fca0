#include <ulysses/ulysses.hpp>
#include <cstdio>
#include <thread>
using namespace ulysses;
int main() {
  const int P = 3;
  LocalGroup g(P, std::chrono::milliseconds(200));
  std::vector<std::string> what(P), what2(P);
  std::vector<std::thread> th;
  for (int r = 0; r < P; ++r) th.emplace_back([&, r] {
    auto c = g.comm(r);
    Plan p({P, r}, 1, SeqPartition::even(6, P), {TensorSpec::of<float>(HeadPartition::even(3, P), 2)});
    std::vector<float> in(p.seq_bytes(0) / 4), out(p.head_bytes(0) / 4);
    std::vector<std::byte> ws(p.workspace_bytes());
    HostExecutor ex;
    if (r == 2) std::this_thread::sleep_for(std::chrono::milliseconds(600));
    try { seq_to_head(p, c, ex, in, out, ws); what[r] = "ok"; } catch (const Error& e) { what[r] = to_string(e.code()) + std::string(": ") + e.what(); }
    try { seq_to_head(p, c, ex, in, out, ws); what2[r] = "ok"; } catch (const Error& e) { what2[r] = to_string(e.code()); }
  });
  for (auto& t : th) t.join();
  for (int r = 0; r < P; ++r) std::printf("rank %d: %s | then %s\n", r, what[r].c_str(), what2[r].c_str());
}
