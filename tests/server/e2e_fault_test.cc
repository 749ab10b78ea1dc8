// End to end, faults: fp4qd killed with SIGKILL in the middle of an
// UpdateWeight storm (while checkpoints are being written), 20 times; damaged
// and leftover checkpoint files; clients that die or disconnect mid-request.
//
// The storm: one writer per weight sends strictly increasing steps and records
// the weight's exact bytes (codes, scales, global amax and s_enc, residual)
// after each step; a checkpointer asks for checkpoints back to back and
// records, per weight, the window of steps each one may hold ([last step
// completed before it was asked for, last step sent before it was answered]).
// After each restart every weight must be at one step s inside the windows of
// ONE checkpoint (the last one answered, or the one in flight at the kill,
// which may have been committed), with exactly the recorded bytes for s, and
// ListTensors/GetWeight must report s.
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "e2e_bad_input.h"
#include "fp4q/kernels/backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shm_region.h"
#include "testing/files.h"

namespace fp4q::server::testing {
namespace {

using ::fp4q::testing::ReadAll;
using ::fp4q::testing::WriteAll;

using ::testing::HasSubstr;

constexpr int kWeights = 4;
constexpr int64_t kRows = 64, kCols = 256;

struct WeightBytes {
  std::string codes, scales, residual;
  float amax = 0, s_enc = 0;
  bool operator==(const WeightBytes& o) const {
    return codes == o.codes && scales == o.scales && residual == o.residual &&
           std::memcmp(&amax, &o.amax, 4) == 0 && std::memcmp(&s_enc, &o.s_enc, 4) == 0;
  }
};

std::string WeightName(int w) { return absl::StrCat("storm/w", w); }

// The delta sent at `step` of weight `w` in `cycle` (deterministic, so it can
// be replayed).
std::string Delta(int cycle, int w, int64_t step) {
  return RandomF32(kRows * kCols, static_cast<uint32_t>(cycle * 7919 + w * 104729 + step), 0.05f);
}

absl::StatusOr<WeightBytes> Fetch(v1::Fp4q::Stub& stub, const std::string& name, int64_t* step) {
  v1::GetWeightRequest r;
  r.set_name(name);
  r.set_quantized(true);
  r.set_residual(true);
  v1::GetWeightReply rep;
  auto ctx = Context("", absl::Seconds(10));
  grpc::Status s = stub.GetWeight(ctx.get(), r, &rep);
  if (!s.ok()) return absl::UnavailableError(s.error_message());
  WeightBytes b{rep.quantized().codes(), rep.quantized().scales(), rep.residual().inline_data(),
                rep.quantized().global_amax(), rep.quantized().s_enc()};
  *step = rep.weight().last_step();
  return b;
}

// The CPU reference's result of applying `delta` to `prev` (what fp4qd computes
// for a step whose reply was lost to the kill).
WeightBytes Replay(WeightBytes prev, const std::string& delta) {
  auto cpu = kernels::CreateCpuBackend();
  float global[2] = {prev.amax, prev.s_enc};
  kernels::QuantizedTensor w;
  w.rows = kRows;
  w.cols = kCols;
  w.codes = reinterpret_cast<uint8_t*>(prev.codes.data());
  w.codes_capacity = prev.codes.size();
  w.scales = reinterpret_cast<uint8_t*>(prev.scales.data());
  w.scales_capacity = prev.scales.size();
  w.global = global;
  kernels::ConstTensor u{delta.data(), kernels::DType::kF32, kRows, kCols};
  absl::Status s =
      cpu->UpdateWeight(w, reinterpret_cast<float*>(prev.residual.data()), u, 0.0f,
                        kernels::UpdateKind::kDelta, kernels::QuantizeOptions(), nullptr, nullptr);
  EXPECT_TRUE(s.ok()) << s;
  prev.amax = global[0];
  prev.s_enc = global[1];
  return prev;
}

struct Window {
  int64_t lo[kWeights];
  int64_t hi[kWeights];
};

struct StormStats {
  int cycles = 0;
  int64_t updates = 0;
  int checkpoints = 0;
  int restored_in_flight = 0;  // restarts that found the checkpoint in flight at the kill
  int leftover_tmp = 0;        // kills that left fp4q-state.ckpt.tmp behind
  int injected_tmp = 0;
  int replayed = 0;  // restored steps whose reply the kill swallowed
};

class Storm {
 public:
  // `sent` records, per weight, the cycle that last sent each step (its update is
  // Delta(that cycle, w, step): what a retry of that step must resend).
  Storm(int cycle, const std::string& address, std::map<int64_t, WeightBytes>* records,
        std::map<int64_t, int>* sent, int64_t* last)
      : cycle_(cycle), address_(address), records_(records), sent_(sent) {
    for (int w = 0; w < kWeights; ++w) {
      issued_[w] = last[w];
      completed_[w] = last[w];
    }
  }

  void Start() {
    for (int w = 0; w < kWeights; ++w) threads_.emplace_back([this, w] { Write(w); });
    threads_.emplace_back([this] { Checkpoints(); });
  }
  // Call after the kill.
  void Join() {
    stop_ = true;
    for (auto& t : threads_) t.join();
  }

  std::mutex mu;
  bool have_acked = false, have_in_flight = false;
  Window acked{}, in_flight{};
  std::atomic<int64_t> issued_[kWeights];
  std::atomic<int64_t> completed_[kWeights];
  int64_t updates = 0;
  int checkpoints = 0;

 private:
  void Write(int w) {
    auto stub = v1::Fp4q::NewStub(MakeChannel(address_));
    for (int64_t step = completed_[w] + 1; !stop_; ++step) {
      v1::UpdateWeightRequest r =
          U(WeightName(w), step, InlineTensor(Delta(cycle_, w, step), kRows, kCols));
      r.set_kind(v1::UPDATE_KIND_DELTA);
      {
        std::lock_guard<std::mutex> lock(mu);
        sent_[w][step] = cycle_;
      }
      issued_[w] = step;
      v1::UpdateWeightReply rep;
      auto ctx = Context("", absl::Seconds(10));
      grpc::Status s = stub->UpdateWeight(ctx.get(), r, &rep);
      if (!s.ok()) return;  // killed
      EXPECT_TRUE(rep.applied() && rep.last_step() == step) << rep.DebugString();
      int64_t got = -1;
      absl::StatusOr<WeightBytes> b = Fetch(*stub, WeightName(w), &got);
      if (!b.ok()) return;
      EXPECT_EQ(got, step);
      {
        std::lock_guard<std::mutex> lock(mu);
        records_[w][step] = *std::move(b);
        ++updates;
      }
      completed_[w] = step;
    }
  }

  void Checkpoints() {
    auto stub = v1::Fp4q::NewStub(MakeChannel(address_));
    std::mt19937 gen(cycle_);
    while (!stop_) {
      Window win;
      {
        std::lock_guard<std::mutex> lock(mu);
        for (int w = 0; w < kWeights; ++w) win.lo[w] = completed_[w];
        in_flight = win;
        have_in_flight = true;
      }
      v1::CheckpointReply rep;
      auto ctx = Context("", absl::Seconds(20));
      grpc::Status s = stub->Checkpoint(ctx.get(), v1::CheckpointRequest(), &rep);
      if (!s.ok()) return;  // killed: in_flight stays, its hi is filled in at the kill
      std::lock_guard<std::mutex> lock(mu);
      for (int w = 0; w < kWeights; ++w) win.hi[w] = issued_[w];
      acked = win;
      have_acked = true;
      have_in_flight = false;
      ++checkpoints;
      EXPECT_EQ(rep.path(), "fp4q-state.ckpt");
      std::this_thread::sleep_for(std::chrono::milliseconds(10 + gen() % 40));
    }
  }

  const int cycle_;
  const std::string address_;
  std::map<int64_t, WeightBytes>* const records_;
  std::map<int64_t, int>* const sent_;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

TEST(E2eFaultTest, KillNineInTheMiddleOfAnUpdateStormTwentyTimes) {
  TempDir dir;
  const std::vector<std::string> flags = {"--state_dir=" + dir.path(), "--workers=2"};
  std::map<int64_t, WeightBytes> records[kWeights];
  std::map<int64_t, int> sent[kWeights];  // the cycle that last sent each step
  int64_t last[kWeights] = {};
  Window acked{}, storm_in_flight{};
  bool have_acked = false;
  {
    auto server = ServerProcess::Start(flags);
    ASSERT_TRUE(server.ok()) << server.status();
    auto stub = (*server)->Stub();
    for (int w = 0; w < kWeights; ++w) {
      v1::CreateWeightRequest r =
          C(WeightName(w), InlineTensor(RandomF32(kRows * kCols, w), kRows, kCols));
      r.mutable_options()->set_error_feedback(true);
      ASSERT_TRUE(Call(*stub, r).ok());
      int64_t step = -1;
      auto b = Fetch(*stub, WeightName(w), &step);
      ASSERT_TRUE(b.ok());
      records[w][0] = *b;
    }
    (*server)->Signal(SIGKILL);  // before any checkpoint: the restart must be empty
    EXPECT_EQ((*server)->Wait(), 128 + SIGKILL);
  }
  StormStats stats;
  std::mt19937 gen(20240601);
  for (int cycle = 0; cycle <= 20; ++cycle) {
    auto server = ServerProcess::Start(flags);
    ASSERT_TRUE(server.ok()) << "cycle " << cycle << ": " << server.status();
    auto stub = (*server)->Stub();
    v1::ListTensorsReply list;
    auto lctx = Context();
    ASSERT_TRUE(stub->ListTensors(lctx.get(), v1::ListTensorsRequest(), &list).ok());
    if (cycle == 0) {
      ASSERT_EQ(list.tensors_size(), 0) << "state without a checkpoint survived a kill";
      for (int w = 0; w < kWeights; ++w) {
        v1::CreateWeightRequest r =
            C(WeightName(w), InlineTensor(RandomF32(kRows * kCols, w), kRows, kCols));
        r.mutable_options()->set_error_feedback(true);
        ASSERT_TRUE(Call(*stub, r).ok());
      }
    } else {
      // ---- The state is one checkpoint's, byte for byte.
      ASSERT_EQ(list.tensors_size(), kWeights) << "cycle " << cycle;
      int64_t step[kWeights];
      WeightBytes got[kWeights];
      for (int w = 0; w < kWeights; ++w) {
        auto b = Fetch(*stub, WeightName(w), &step[w]);
        ASSERT_TRUE(b.ok()) << b.status();
        got[w] = *std::move(b);
        EXPECT_EQ(list.tensors(w).name(), WeightName(w));
        EXPECT_EQ(list.tensors(w).last_step(), step[w]) << "ListTensors and GetWeight disagree";
      }
      ASSERT_TRUE(have_acked);
      auto inside = [&](const Window& win) {
        for (int w = 0; w < kWeights; ++w) {
          if (step[w] < win.lo[w] || step[w] > win.hi[w]) return false;
        }
        return true;
      };
      const bool from_acked = inside(acked);
      // The kill may have landed after the in-flight checkpoint was renamed
      // into place.
      ASSERT_TRUE(from_acked || inside(storm_in_flight))
          << "cycle " << cycle << ": steps " << step[0] << "," << step[1] << "," << step[2] << ","
          << step[3] << " are in no checkpoint's window";
      if (!from_acked) ++stats.restored_in_flight;
      for (int w = 0; w < kWeights; ++w) {
        auto it = records[w].find(step[w]);
        WeightBytes want;
        if (it != records[w].end()) {
          want = it->second;
        } else {
          // Applied, checkpointed, but its reply was lost to the kill: replay
          // it.
          ASSERT_TRUE(records[w].count(step[w] - 1)) << "cycle " << cycle << " weight " << w;
          want = Replay(records[w][step[w] - 1], Delta(cycle - 1, w, step[w]));
          ++stats.replayed;
        }
        EXPECT_TRUE(got[w] == want) << "cycle " << cycle << " weight " << w << " step " << step[w]
                                    << ": bytes differ from the recorded state";
        // Later steps of the killed run are gone; the next run writes new ones.
        records[w].erase(records[w].upper_bound(step[w]), records[w].end());
        records[w][step[w]] = want;
        last[w] = step[w];
        // The restored step, resent as it was, is a safe retry: applied=false, nothing
        // changes (the checkpoint keeps each weight's last update fingerprint).
        v1::UpdateWeightReply rep;
        auto uctx = Context();
        if (step[w] == 0) continue;  // never updated: its creation step is not a retry
        ASSERT_TRUE(sent[w].count(step[w])) << "cycle " << cycle << " weight " << w;
        v1::UpdateWeightRequest dup =
            U(WeightName(w), step[w], InlineTensor(Delta(sent[w][step[w]], w, step[w]), kRows, kCols));
        dup.set_kind(v1::UPDATE_KIND_DELTA);
        ASSERT_TRUE(stub->UpdateWeight(uctx.get(), dup, &rep).ok());
        EXPECT_FALSE(rep.applied());
        EXPECT_EQ(rep.last_step(), step[w]);
      }
      if (cycle == 20) break;
    }
    if (cycle == 0) {
      for (int w = 0; w < kWeights; ++w) {
        int64_t s = -1;
        auto b = Fetch(*stub, WeightName(w), &s);
        ASSERT_TRUE(b.ok());
        records[w].clear();
        records[w][0] = *b;
      }
      v1::CheckpointReply rep;
      auto cctx = Context();
      ASSERT_TRUE(stub->Checkpoint(cctx.get(), v1::CheckpointRequest(), &rep).ok());
      acked = Window{};  // every weight at step 0
      have_acked = true;
    }
    // ---- The storm, and a kill at a random moment of it.
    Storm storm(cycle, (*server)->address(), records, sent, last);
    storm.Start();
    std::this_thread::sleep_for(std::chrono::milliseconds(250 + gen() % 500));
    (*server)->Signal(SIGKILL);
    EXPECT_EQ((*server)->Wait(), 128 + SIGKILL);
    storm.Join();
    {
      std::lock_guard<std::mutex> lock(storm.mu);
      if (storm.have_acked) {
        acked = storm.acked;
        have_acked = true;
      }
      for (int w = 0; w < kWeights; ++w) storm.in_flight.hi[w] = storm.issued_[w];
      storm_in_flight = storm.have_in_flight ? storm.in_flight : acked;
      stats.updates += storm.updates;
      stats.checkpoints += storm.checkpoints;
    }
    ++stats.cycles;
    // ---- A partial temp file never counts; sometimes plant one.
    const std::string tmp = dir.File("fp4q-state.ckpt.tmp");
    if (Exists(tmp)) {
      ++stats.leftover_tmp;
    } else if (cycle % 3 == 1) {
      std::ofstream(tmp, std::ios::binary) << "FP4QCKP1 torn";
      ++stats.injected_tmp;
    }
  }
  EXPECT_EQ(stats.cycles, 20);
  EXPECT_GT(stats.updates, 200);
  EXPECT_GT(stats.checkpoints, 20);
  std::cout << "kill -9 storm: cycles=" << stats.cycles << " updates=" << stats.updates
            << " checkpoints=" << stats.checkpoints
            << " restored_from_in_flight_checkpoint=" << stats.restored_in_flight
            << " leftover_tmp=" << stats.leftover_tmp << " injected_tmp=" << stats.injected_tmp
            << " replayed_lost_replies=" << stats.replayed << std::endl;
  RecordProperty("updates", static_cast<int>(stats.updates));
  RecordProperty("checkpoints", stats.checkpoints);
}

// ---------------------------------------------------------------- damaged
// checkpoint files

// Writes a checkpoint holding weight "d/a" at `step` (a clean SIGTERM) and
// returns its bytes.
std::string MakeCheckpoint(const std::string& dir, int64_t step, std::string* codes) {
  auto server = ServerProcess::Start({"--state_dir=" + dir});
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) return "";
  auto stub = (*server)->Stub();
  v1::CreateWeightRequest r = C("d/a", InlineTensor(RandomF32(16 * 64, step), 16, 64));
  r.mutable_options()->set_error_feedback(true);
  r.set_step(step);
  EXPECT_TRUE(Call(*stub, r).ok());
  int64_t got = -1;
  auto b = Fetch(*stub, "d/a", &got);
  EXPECT_TRUE(b.ok());
  *codes = b.ok() ? b->codes : "";
  (*server)->Signal(SIGTERM);
  EXPECT_EQ((*server)->Wait(), 0);
  return ReadAll(dir + "/fp4q-state.ckpt");
}

TEST(E2eFaultTest, DamagedOrLeftoverCheckpointFilesAreNeverLoaded) {
  TempDir dir;
  const std::string ckpt = dir.File("fp4q-state.ckpt"), tmp = dir.File("fp4q-state.ckpt.tmp");
  std::string codes3, codes8;
  const std::string newer = MakeCheckpoint(dir.path(), 8, &codes8);
  ::unlink(ckpt.c_str());
  const std::string good = MakeCheckpoint(dir.path(), 3, &codes3);
  ASSERT_GT(good.size(), 100u);
  ASSERT_NE(codes3, codes8);
  const std::vector<std::string> flags = {"--state_dir=" + dir.path()};

  struct Damage {
    const char* name;
    std::string bytes;
    const char* log;
  } damages[] = {
      {"truncated to half", good.substr(0, good.size() / 2), "is truncated"},
      {"truncated by one byte", good.substr(0, good.size() - 1), "is truncated"},
      {"empty", "", "is truncated"},
      {"one flipped byte", good, "is corrupt"},
      {"garbage", std::string(4096, 'G'), "is truncated"},
  };
  damages[3].bytes[good.size() / 2] ^= 0x20;
  for (const Damage& d : damages) {
    WriteAll(ckpt, d.bytes);
    std::string log;
    EXPECT_EQ(RunServerToExit(flags, &log), 3) << d.name;
    EXPECT_THAT(log, HasSubstr(d.log)) << d.name;
    EXPECT_EQ(ReadAll(ckpt), d.bytes) << d.name << ": the damaged file was modified";
  }
  // Ignored on request: renamed aside, start empty.
  WriteAll(ckpt, damages[0].bytes);
  {
    auto server =
        ServerProcess::Start({"--state_dir=" + dir.path(), "--ignore_corrupt_checkpoint"});
    ASSERT_TRUE(server.ok()) << server.status();
    auto stub = (*server)->Stub();
    v1::ListTensorsReply list;
    auto ctx = Context();
    ASSERT_TRUE(stub->ListTensors(ctx.get(), v1::ListTensorsRequest(), &list).ok());
    EXPECT_EQ(list.tensors_size(), 0);
    EXPECT_FALSE(Exists(ckpt));
  }
  // Only a temp file, even a complete and valid one: never loaded, start empty.
  WriteAll(tmp, newer);
  {
    auto server = ServerProcess::Start(flags);
    ASSERT_TRUE(server.ok()) << server.status();
    auto stub = (*server)->Stub();
    v1::ListTensorsReply list;
    auto ctx = Context();
    ASSERT_TRUE(stub->ListTensors(ctx.get(), v1::ListTensorsRequest(), &list).ok());
    EXPECT_EQ(list.tensors_size(), 0) << "a .tmp file was loaded";
  }
  // A good checkpoint beside a torn or a newer temp file: the checkpoint, byte
  // for byte.
  for (const std::string& leftover : {std::string("FP4QCKP1 torn write"), newer}) {
    WriteAll(ckpt, good);
    WriteAll(tmp, leftover);
    auto server = ServerProcess::Start(flags);
    ASSERT_TRUE(server.ok()) << server.status();
    auto stub = (*server)->Stub();
    int64_t step = -1;
    auto b = Fetch(*stub, "d/a", &step);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(step, 3);
    EXPECT_EQ(b->codes, codes3);
    // The next checkpoint replaces the leftover.
    v1::CheckpointReply rep;
    auto ctx = Context();
    ASSERT_TRUE(stub->Checkpoint(ctx.get(), v1::CheckpointRequest(), &rep).ok());
    EXPECT_FALSE(Exists(tmp));
  }
}

// ---------------------------------------------------------------- clients that
// go away

// The child client (e2e_client_child.cc) with its stdout on a pipe; killed on
// destruction.
class Child {
 public:
  Child(const std::string& target, const std::string& mode) {
    int fds[2];
    if (::pipe(fds) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(fds[1], 1);
      ::close(fds[0]);
      ::execl(CLIENT_CHILD, CLIENT_CHILD, target.c_str(), mode.c_str(), nullptr);
      ::_exit(127);
    }
    ::close(fds[1]);
    out_ = ::fdopen(fds[0], "r");
  }
  ~Child() {
    Kill();
    if (out_ != nullptr) std::fclose(out_);
  }
  // The "ready ..." line's words; empty when the child failed.
  std::vector<std::string> Ready() {
    char line[512];
    if (out_ == nullptr || std::fgets(line, sizeof(line), out_) == nullptr) return {};
    std::vector<std::string> words =
        absl::StrSplit(std::string(line), absl::ByAnyChar(" \n"), absl::SkipEmpty());
    if (words.size() != 3 || words[0] != "ready") return {};
    return words;
  }
  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  std::FILE* out_ = nullptr;
};

// Polls /metrics until every `want` gauge has its value; the last text on
// timeout.
bool GaugesReach(const std::string& metrics, const std::map<std::string, double>& want,
                 std::string* text) {
  for (int i = 0; i < 200; ++i) {
    absl::StatusOr<std::string> t = HttpGet(metrics, "/metrics");
    if (t.ok()) {
      *text = *t;
      bool all = true;
      for (const auto& [name, value] : want) {
        absl::StatusOr<double> v = MetricValue(*t, name);
        all = all && v.ok() && *v == value;
      }
      if (all) return true;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return false;
}

TEST(E2eFaultTest, ClientsThatDieOrDisconnectMidRequestLeakNothing) {
  TempDir dir;
  const std::string sock = dir.File("sock");
  auto server =
      ServerProcess::Start({"--backend=cuda", "--cuda_module=" FAKE_SHM_MODULE, "--allow_cuda_ipc",
                            "--unix_socket=" + sock, "--session_lease_s=1", "--workers=2"});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string metrics = (*server)->metrics_address();
  const std::map<std::string, double> idle = {{"fp4q_sessions", 0},
                                              {"fp4q_cuda_regions", 0},
                                              {"fp4q_cuda_open_handles", 0},
                                              {"fp4q_requests_in_flight", 0}};
  std::string text;
  for (int round = 0; round < 3; ++round) {
    // A client with a registered region, killed while it quantizes from that
    // region.
    Child child("unix:" + sock, "region");
    const std::vector<std::string> ready = child.Ready();
    ASSERT_EQ(ready.size(), 3u) << "the child client failed to start";
    ASSERT_TRUE(GaugesReach(metrics,
                            {{"fp4q_sessions", 1},
                             {"fp4q_cuda_regions", 1},
                             {"fp4q_cuda_open_handles", 1},
                             {"fp4q_requests_in_flight", 1}},
                            &text))
        << text;
    child.Kill();
    ::shm_unlink(ready[2].c_str());  // the dead child cannot
    EXPECT_TRUE(GaugesReach(metrics, idle, &text)) << "round " << round << "\n" << text;
  }
  // A client killed in the middle of a 4 MiB inline request.
  {
    Child child("unix:" + sock, "inline");
    ASSERT_EQ(child.Ready().size(), 3u);
    absl::SleepFor(absl::Milliseconds(150));
    child.Kill();
    EXPECT_TRUE(GaugesReach(metrics, idle, &text)) << text;
  }
  // Requests abandoned by their client: a deadline that expires mid-request,
  // and a cancel.
  auto stub = (*server)->Stub();
  v1::QuantizeRequest big = Q(InlineTensor(RandomF32(2048 * 1024, 3), 2048, 1024));
  {
    v1::QuantizeReply rep;
    auto ctx = Context("", absl::Milliseconds(5));
    EXPECT_EQ(stub->Quantize(ctx.get(), big, &rep).error_code(),
              grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  {
    v1::QuantizeReply rep;
    auto ctx = Context();
    std::thread cancel([&] {
      absl::SleepFor(absl::Milliseconds(2));  // well before a 8 MiB Quantize can finish
      ctx->TryCancel();
    });
    EXPECT_EQ(stub->Quantize(ctx.get(), big, &rep).error_code(), grpc::StatusCode::CANCELLED);
    cancel.join();
  }
  EXPECT_TRUE(GaugesReach(metrics, idle, &text)) << text;
  // And the server still serves.
  v1::QuantizeReply rep;
  auto ctx = Context();
  EXPECT_TRUE(stub->Quantize(ctx.get(), Q(InlineTensor(RandomF32(32, 1), 2, 16)), &rep).ok());
}

}  // namespace
}  // namespace fp4q::server::testing
