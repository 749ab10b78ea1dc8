// End to end, hostile inputs that need working regions: fp4qd with the fake
// shared-memory GPU module (fake_shm_cuda_module.cc), so region slices really
// cross processes. Offsets and sizes that overflow, misaligned and overlapping
// slices, another session's regions, truncated and forged handles, and
// concurrent deletes and out-of-order steps. Every refused request leaves the
// state and both clients' memory untouched, and fp4qd keeps serving.
#include <atomic>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "e2e_bad_input.h"
#include "fp4q/client/fast_socket.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shm_region.h"

namespace fp4q::server::testing {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::Not;
using Code = grpc::StatusCode;

constexpr size_t kRegionBytes = 1 << 16;
constexpr uint64_t kWrap = std::numeric_limits<uint64_t>::max() - 15;  // 2^64 - 16, aligned

std::string Register(v1::Fp4q::Stub& stub, const std::string& session, const std::string& handle,
                     uint64_t size) {
  v1::RegisterCudaRegionRequest r;
  r.set_ipc_handle(handle);
  r.set_size(size);
  v1::RegisterCudaRegionReply rep;
  grpc::Status s = Call(stub, r, session, &rep);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return rep.region_id();
}

v1::OutputTarget At(const std::string& region, uint64_t offset) {
  v1::OutputTarget t;
  t.mutable_region()->set_region_id(region);
  t.mutable_region()->set_offset(offset);
  return t;
}

// A Quantize of [2, 16] f32 at offset 0 of the caller's region, changed by
// `set`.
template <typename F>
BadCase Rq(std::string name, F set, Code code, std::string message) {
  return {std::move(name),
          [set](v1::Fp4q::Stub& s, const BadEnv& env) {
            v1::QuantizeRequest r = Q(RegionTensor(env.region, 0, 2, 16));
            set(&r, env);
            return Call(s, r, env.session);
          },
          code, std::move(message)};
}

std::vector<BadCase> RegionCases() {
  using QR = v1::QuantizeRequest;
  return {
      Rq(
          "misaligned input offset",
          [](QR* r, const BadEnv&) { r->mutable_input()->mutable_region()->set_offset(8); },
          Code::INVALID_ARGUMENT, "input.region.offset: 8 is not a multiple of 16"),
      Rq(
          "input past the end by 16 bytes",
          [](QR* r, const BadEnv&) {
            r->mutable_input()->mutable_region()->set_offset(kRegionBytes - 112);
          },
          Code::INVALID_ARGUMENT,
          "input.region.offset: 65424 + 128 bytes is past the end of the "
          "region (65536 bytes)"),
      Rq(
          "input offset at the end",
          [](QR* r, const BadEnv&) {
            r->mutable_input()->mutable_region()->set_offset(kRegionBytes);
          },
          Code::INVALID_ARGUMENT, "input.region.offset: 65536 + 128 bytes is past the end"),
      Rq(
          "offset + size wraps 64 bits",
          [](QR* r, const BadEnv&) { r->mutable_input()->mutable_region()->set_offset(kWrap); },
          Code::INVALID_ARGUMENT, "input.region.offset: 18446744073709551600 + 128 bytes is past"),
      Rq(
          "region tensor of 4 TiB",
          [](QR* r, const BadEnv&) {
            r->mutable_input()->set_shape(0, int64_t{1} << 20);
            r->mutable_input()->set_shape(1, int64_t{1} << 20);
          },
          Code::INVALID_ARGUMENT, "input.region.offset: 0 + 4398046511104 bytes is past the end"),
      Rq(
          "region tensor whose byte size overflows",
          [](QR* r, const BadEnv&) {
            r->mutable_input()->set_shape(0, int64_t{1} << 40);
            r->mutable_input()->set_shape(1, int64_t{1} << 40);
          },
          Code::INVALID_ARGUMENT,
          "input.shape: f32 bytes of [1099511627776, 1099511627776] exceed the "
          "limit of 2^62"),
      Rq(
          "output offset wraps 64 bits",
          [](QR* r, const BadEnv& e) { *r->mutable_rowwise_codes() = At(e.region, kWrap); },
          Code::INVALID_ARGUMENT, "rowwise_codes.region.offset: 18446744073709551600 + 16 bytes"),
      Rq(
          "output over the input",
          [](QR* r, const BadEnv& e) { *r->mutable_rowwise_codes() = At(e.region, 0); },
          Code::INVALID_ARGUMENT, "rowwise_codes.region: overlaps input.region"),
      Rq(
          "codes and scales overlap",
          [](QR* r, const BadEnv& e) {
            *r->mutable_rowwise_codes() = At(e.region, 1024);
            *r->mutable_rowwise_scales() = At(e.region, 1024);
          },
          Code::INVALID_ARGUMENT, "overlaps"),
      Rq(
          "another session's region as input",
          [](QR* r, const BadEnv& e) {
            r->mutable_input()->mutable_region()->set_region_id(e.other_region);
          },
          Code::NOT_FOUND, "input.region.region_id: no region '"),
      Rq(
          "another session's region as output",
          [](QR* r, const BadEnv& e) { *r->mutable_rowwise_scales() = At(e.other_region, 0); },
          Code::NOT_FOUND, "rowwise_scales.region.region_id: no region '"),
      Rq(
          "control bytes in a region id are escaped",
          [](QR* r, const BadEnv&) {
            r->mutable_input()->mutable_region()->set_region_id(std::string("\x01\x7f'\n", 4));
          },
          Code::NOT_FOUND, "input.region.region_id: no region '\\001\\177\\'\\n'"),
      {"the other session's metadata with this session's region",
       [](auto& s, auto& e) {
         return Call(s, Q(RegionTensor(e.region, 0, 2, 16)), e.other_session);
       },
       Code::NOT_FOUND, "input.region.region_id: no region '"},
      {"region without session metadata",
       [](auto& s, auto& e) { return Call(s, Q(RegionTensor(e.region, 0, 2, 16))); },
       Code::NOT_FOUND, "(no 'fp4q-session' metadata was sent)"},
      {"QDQ output partly over its input",
       [](auto& s, auto& e) {
         v1::QdqRequest r = Qdq(RegionTensor(e.region, 0, 2, 16));
         *r.mutable_out() = At(e.region, 16);
         return Call(s, r, e.session);
       },
       Code::INVALID_ARGUMENT, "out.region: overlaps input.region"},
      {"QDQ in place with another dtype",
       [](auto& s, auto& e) {
         v1::QdqRequest r = Qdq(RegionTensor(e.region, 0, 2, 16));
         r.set_out_dtype(v1::DTYPE_BF16);
         *r.mutable_out() = At(e.region, 0);
         return Call(s, r, e.session);
       },
       Code::INVALID_ARGUMENT, "out.region: overlaps input.region"},
      {"dequantize codes region past the end",
       [](auto& s, auto& e) {
         v1::DequantizeRequest r;
         v1::QuantizedTensor* t = r.mutable_input()->mutable_tensor();
         *t = ZeroOperand(2, 16);
         t->mutable_codes_region()->set_region_id(e.region);
         t->mutable_codes_region()->set_offset(kRegionBytes - 8);
         return Call(s, r, e.session);
       },
       Code::INVALID_ARGUMENT, "input.tensor.codes_region.offset: 65528 is not a multiple of 16"},
      {"dequantize scales region past the end",
       [](auto& s, auto& e) {
         v1::DequantizeRequest r;
         v1::QuantizedTensor* t = r.mutable_input()->mutable_tensor();
         *t = ZeroOperand(2, 16);
         t->mutable_scales_region()->set_region_id(e.region);
         t->mutable_scales_region()->set_offset(kRegionBytes);
         return Call(s, r, e.session);
       },
       Code::INVALID_ARGUMENT,
       "input.tensor.scales_region.offset: 65536 + 2 bytes is past the end"},
      {"matmul output past the end",
       [](auto& s, auto& e) {
         v1::MatmulRequest r;
         *r.mutable_a()->mutable_tensor() = ZeroOperand(2, 32);
         *r.mutable_b()->mutable_tensor() = ZeroOperand(2, 32);
         *r.mutable_out() = At(e.region, kRegionBytes);
         return Call(s, r, e.session);
       },
       Code::INVALID_ARGUMENT, "out.region.offset: 65536 + 16 bytes is past the end"},
      {"update from a misaligned region slice",
       [](auto& s, auto& e) {
         return Call(s, U("w", 6, RegionTensor(e.region, 4, 16, 32)), e.session);
       },
       Code::INVALID_ARGUMENT, "update.region.offset: 4 is not a multiple of 16"},
      {"get weight into another session's region",
       [](auto& s, auto& e) {
         v1::GetWeightRequest r;
         r.set_name("w");
         r.set_dequantized(true);
         *r.mutable_out() = At(e.other_region, 0);
         return Call(s, r, e.session);
       },
       Code::NOT_FOUND, "out.region.region_id: no region '"},
      {"unregister another session's region",
       [](auto& s, auto& e) {
         v1::UnregisterCudaRegionRequest r;
         r.set_region_id(e.other_region);
         return Call(s, r, e.session);
       },
       Code::NOT_FOUND, "region_id: no region '"},
      {"truncated handle",
       [](auto& s, auto& e) {
         v1::RegisterCudaRegionRequest r;
         r.set_ipc_handle(std::string("FP4QSHM:/fp4q-x") + std::string(48, '\0'));
         r.set_size(4096);
         return Call(s, r, e.session);
       },
       Code::INVALID_ARGUMENT, "ipc_handle: 63 bytes, expected 64"},
      {"forged handle",
       [](auto& s, auto& e) {
         v1::RegisterCudaRegionRequest r;
         r.set_ipc_handle(std::string(64, '\x7f'));
         r.set_size(4096);
         return Call(s, r, e.session);
       },
       Code::INVALID_ARGUMENT, "ipc_handle: not a fake shared-memory handle"},
      {"declared size beyond the allocation",
       [](auto& s, auto& e) {
         ShmRegion small(4096);
         v1::RegisterCudaRegionRequest r;
         r.set_ipc_handle(small.Handle());
         r.set_size(8192);
         return Call(s, r, e.session);
       },
       Code::INVALID_ARGUMENT,
       "size: 8192 bytes is larger than the allocation behind ipc_handle (4096 bytes)"},
      {"handle of nothing",
       [](auto& s, auto& e) {
         std::string h(64, '\0');
         std::memcpy(h.data(), "FP4QSHM:/fp4q-no-such-object", 28);
         v1::RegisterCudaRegionRequest r;
         r.set_ipc_handle(h);
         r.set_size(4096);
         return Call(s, r, e.session);
       },
       Code::INVALID_ARGUMENT, "ipc_handle: invalid resource handle"},
  };
}

class E2eRegionInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(mine_.ok() && theirs_.ok()) << "cannot create shared memory objects";
    auto server = ServerProcess::Start({"--backend=cuda", "--cuda_module=" FAKE_SHM_MODULE,
                                        "--allow_cuda_ipc", "--unix_socket=" + dir_.File("sock"),
                                        "--state_budget_bytes=20000"});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    stub_ = v1::Fp4q::NewStub(MakeChannel("unix:" + dir_.File("sock")));
    ASSERT_TRUE(CreateBaseline(*stub_));
    env_.session = OpenSession(*stub_, "region-client");
    env_.other_session = OpenSession(*stub_, "another-client");
    env_.region = Register(*stub_, env_.session, mine_.Handle(), kRegionBytes);
    env_.other_region = Register(*stub_, env_.other_session, theirs_.Handle(), kRegionBytes);
    env_.region_bytes = kRegionBytes;
    ASSERT_FALSE(env_.region.empty());
    ASSERT_FALSE(env_.other_region.empty());
    // Input data at offset 0, poison everywhere else; the other client's memory
    // all poison.
    std::memset(mine_.data(), 0xEE, kRegionBytes);
    std::memset(theirs_.data(), 0xDD, kRegionBytes);
    const std::string x = RandomF32(16 * 32, 9);
    std::memcpy(mine_.data(), x.data(), x.size());
  }

  TempDir dir_;
  ShmRegion mine_{kRegionBytes};
  ShmRegion theirs_{kRegionBytes};
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<v1::Fp4q::Stub> stub_;
  BadEnv env_;
};

TEST_F(E2eRegionInputTest, EachBadRegionInputGetsItsCodeAndTouchesNothing) {
  const StateSnapshot before = TakeSnapshot(*stub_);
  const std::string mine(reinterpret_cast<char*>(mine_.data()), kRegionBytes);
  const std::string theirs(reinterpret_cast<char*>(theirs_.data()), kRegionBytes);
  const std::vector<BadCase> cases = RegionCases();
  EXPECT_GE(cases.size(), 20u);
  for (const BadCase& c : cases) {
    grpc::Status s = c.call(*stub_, env_);
    EXPECT_EQ(s.error_code(), c.code) << c.name << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(c.message)) << c.name;
    EXPECT_THAT(s.error_message(), Not(HasSubstr(env_.other_session))) << c.name;
    EXPECT_THAT(s.error_message(), Not(HasSubstr("another-client"))) << c.name;
    EXPECT_THAT(s.error_message(), Not(HasSubstr("/fp4q-test-"))) << c.name;  // shm names
    EXPECT_TRUE(TakeSnapshot(*stub_) == before) << c.name << " changed the state";
    EXPECT_EQ(std::string(reinterpret_cast<char*>(mine_.data()), kRegionBytes), mine) << c.name;
    EXPECT_EQ(std::string(reinterpret_cast<char*>(theirs_.data()), kRegionBytes), theirs) << c.name;
  }
  // Another session's region id reads exactly like an id nobody has.
  grpc::Status foreign = Call(*stub_, Q(RegionTensor(env_.other_region, 0, 2, 16)), env_.session);
  const std::string unknown_id(env_.other_region.size(), '0');
  grpc::Status unknown = Call(*stub_, Q(RegionTensor(unknown_id, 0, 2, 16)), env_.session);
  EXPECT_EQ(foreign.error_code(), unknown.error_code());
  std::string expected = unknown.error_message();
  expected.replace(expected.find(unknown_id), unknown_id.size(), env_.other_region);
  EXPECT_EQ(foreign.error_message(), expected);
  // Both regions still work for their owners, after all that.
  v1::QuantizeRequest ok = Q(RegionTensor(env_.region, 0, 2, 16));
  *ok.mutable_rowwise_codes() = At(env_.region, 4096);
  grpc::Status mine_ok = Call(*stub_, ok, env_.session);
  EXPECT_TRUE(mine_ok.ok()) << mine_ok.error_message();
  EXPECT_NE(mine_.data()[4096], 0xEE) << "the codes were not written";
  grpc::Status theirs_ok =
      Call(*stub_, Q(RegionTensor(env_.other_region, 0, 2, 16)), env_.other_session);
  EXPECT_TRUE(theirs_ok.ok()) << theirs_ok.error_message();
}

TEST_F(E2eRegionInputTest, ConcurrentDeletesOfOneWeightSucceedExactlyOnce) {
  for (int round = 0; round < 3; ++round) {
    ASSERT_TRUE(Call(*stub_, C("cw", InlineTensor(RandomF32(16 * 16, 3), 16, 16))).ok());
    std::atomic<int> ok{0}, not_found{0}, other{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&] {
        auto stub = v1::Fp4q::NewStub(MakeChannel("unix:" + dir_.File("sock")));
        v1::DeleteWeightRequest r;
        r.set_name("cw");
        grpc::Status s = Call(*stub, r);
        if (s.ok()) {
          ++ok;
        } else if (s.error_code() == Code::NOT_FOUND &&
                   s.error_message().find("name: no weight or residual 'cw'") == 0) {
          ++not_found;
        } else {
          ++other;
        }
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(ok.load(), 1) << "round " << round;
    EXPECT_EQ(not_found.load(), 7) << "round " << round;
    EXPECT_EQ(other.load(), 0) << "round " << round;
  }
}

TEST_F(E2eRegionInputTest, UpdatesRacingADeleteAndOutOfOrderStepsStayConsistent) {
  const StateSnapshot baseline = TakeSnapshot(*stub_);
  ASSERT_TRUE(Call(*stub_, C("cu", InlineTensor(RandomF32(16 * 16, 4), 16, 16))).ok());
  // Four writers send interleaved steps t, t+4, t+8, ... while a fifth deletes
  // the weight.
  std::atomic<int> applied{0}, older{0}, gone{0}, other{0};
  std::atomic<int64_t> max_applied{0};
  std::vector<std::thread> threads;
  for (int t = 1; t <= 4; ++t) {
    threads.emplace_back([&, t] {
      auto stub = v1::Fp4q::NewStub(MakeChannel("unix:" + dir_.File("sock")));
      for (int64_t step = t; step <= 200; step += 4) {
        v1::UpdateWeightReply rep;
        auto ctx = Context();
        grpc::Status s = stub->UpdateWeight(
            ctx.get(), U("cu", step, InlineTensor(RandomF32(256, step), 16, 16)), &rep);
        if (s.ok() && rep.applied() && rep.last_step() == step) {
          ++applied;
          int64_t m = max_applied.load();
          while (step > m && !max_applied.compare_exchange_weak(m, step)) {
          }
        } else if (s.ok() && !rep.applied()) {
          ++other;  // no step is sent twice
        } else if (s.error_code() == Code::FAILED_PRECONDITION &&
                   s.error_message().find(" is older than the last step ") != std::string::npos) {
          ++older;
        } else if (s.error_code() == Code::NOT_FOUND &&
                   s.error_message() == "name: no weight 'cu'") {
          ++gone;
        } else {
          ++other;
          ADD_FAILURE() << s.error_code() << ": " << s.error_message();
        }
      }
    });
  }
  threads.emplace_back([&] {
    auto stub = v1::Fp4q::NewStub(MakeChannel("unix:" + dir_.File("sock")));
    while (applied.load() < 20) std::this_thread::yield();
    v1::DeleteWeightRequest r;
    r.set_name("cu");
    grpc::Status s = Call(*stub, r);
    EXPECT_TRUE(s.ok()) << s.error_message();
  });
  for (auto& t : threads) t.join();
  EXPECT_GE(applied.load(), 20);
  EXPECT_GT(gone.load(), 0);
  EXPECT_EQ(other.load(), 0);
  EXPECT_EQ(applied.load() + older.load() + gone.load(), 200);
  EXPECT_LE(max_applied.load(), 200);
  // The weight is gone, everything else is as it was, and the server serves.
  v1::GetWeightRequest g;
  g.set_name("cu");
  grpc::Status s = Call(*stub_, g);
  EXPECT_EQ(s.error_code(), Code::NOT_FOUND);
  EXPECT_TRUE(TakeSnapshot(*stub_) == baseline);
}


// Step plans end to end, over gRPC and the fast socket alike: one step keeps its items, later
// steps name them by id; the DQ(W) they write is byte for byte what the same steps write when
// they send their items; a dropped plan answers NOT_FOUND on both transports.
TEST(E2eStepPlanTest, PlannedStepsWriteWhatSentStepsWriteOnBothTransports) {
  TempDir dir;
  ShmRegion memory(1 << 16);
  ASSERT_TRUE(memory.ok());
  const std::string fast = dir.File("fast.sock");
  auto server = ServerProcess::Start({"--backend=cuda", "--cuda_module=" FAKE_SHM_MODULE,
                                      "--allow_cuda_ipc", "--unix_socket=" + dir.File("sock"),
                                      "--fast_socket=" + fast, "--max_step_plans=2"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::Fp4q::NewStub(MakeChannel("unix:" + dir.File("sock")));
  const std::string session = OpenSession(*stub, "planner");
  const std::string region = Register(*stub, session, memory.Handle(), 1 << 16);
  ASSERT_FALSE(region.empty());
  client::FastSocketOptions fo;
  fo.path = fast;
  absl::StatusOr<std::unique_ptr<client::FastSocket>> f = client::FastSocket::Connect(fo, session);
  ASSERT_TRUE(f.ok()) << f.status();
  v1::ServerInfoReply info;
  auto ictx = Context(session);
  ASSERT_TRUE(stub->ServerInfo(ictx.get(), v1::ServerInfoRequest(), &info).ok());
  EXPECT_THAT(info.supported_modes(), ::testing::Contains("step_plans"));
  EXPECT_EQ(info.limits().max_step_plans(), 2u);
  // Three copies of two weights (16x32 and 32x16): "g" planned over gRPC, "f" planned over the
  // fast socket, "s" sent with items. Gradients (f32) at 0 and 2048, DQ(W) (f32) of copy k at
  // 8192 + 8192 k and 8192 + 8192 k + 2048.
  const char* copies[] = {"g", "f", "s"};
  for (int k = 0; k < 3; ++k) {
    for (int w = 0; w < 2; ++w) {
      const int64_t rows = w == 0 ? 16 : 32, cols = 512 / rows;
      ASSERT_TRUE(Call(*stub, C(absl::StrCat(copies[k], w),
                                InlineTensor(RandomF32(512, 30 + w), rows, cols)),
                       session)
                      .ok());
    }
  }
  auto request = [&](int k, int64_t step) {
    v1::StepRequest r;
    r.set_step(step);
    r.add_groups()->set_lr(0.5f);
    r.set_brief_reply(true);
    for (int w = 0; w < 2; ++w) {
      const int64_t rows = w == 0 ? 16 : 32, cols = 512 / rows;
      v1::StepItem* it = r.add_items();
      it->set_name(absl::StrCat(copies[k], w));
      *it->mutable_update() = RegionTensor(region, 2048 * w, rows, cols);
      *it->mutable_dequantized_out() = At(region, 8192 + 8192 * k + 2048 * w);
    }
    return r;
  };
  auto by_grpc = [&](const v1::StepRequest& r) -> absl::StatusOr<v1::StepReply> {
    v1::StepReply rep;
    auto ctx = Context(session);
    grpc::Status s = stub->Step(ctx.get(), r, &rep);
    if (!s.ok()) return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                                     s.error_message());
    return rep;
  };
  auto by_fast = [&](const v1::StepRequest& r) { return (*f)->Step(r); };
  uint64_t ids[2] = {0, 0};
  for (int64_t step = 1; step <= 4; ++step) {
    const std::string g = RandomF32(1024, 40 + static_cast<uint32_t>(step));
    std::memcpy(memory.data(), g.data(), g.size());
    std::memset(memory.data() + 8192, 0xEE, 3 * 8192);  // poison every output
    for (int k = 0; k < 3; ++k) {
      v1::StepRequest r = request(k, step);
      if (k < 2 && step == 1) r.set_keep_plan(true);
      if (k < 2 && step > 1) {
        r.clear_items();
        r.set_plan_id(ids[k]);
      }
      absl::StatusOr<v1::StepReply> rep = k == 1 ? by_fast(r) : by_grpc(r);
      ASSERT_TRUE(rep.ok()) << copies[k] << " step " << step << ": " << rep.status();
      EXPECT_EQ(rep->applied_items(), 2u);
      if (step == 1 && k < 2) {
        ids[k] = rep->plan_id();
        EXPECT_NE(ids[k], 0u);
      } else {
        EXPECT_EQ(rep->plan_id(), 0u);
      }
    }
    const std::string sent(reinterpret_cast<char*>(memory.data()) + 8192 + 2 * 8192, 4096);
    EXPECT_EQ(sent.find(std::string(16, '\xEE')), std::string::npos) << "step " << step;
    for (int k = 0; k < 2; ++k) {
      EXPECT_EQ(std::string(reinterpret_cast<char*>(memory.data()) + 8192 + 8192 * k, 4096), sent)
          << copies[k] << " step " << step;
    }
  }
  EXPECT_NE(ids[0], ids[1]);
  // A third plan drops the least recently used (--max_step_plans=2): the gRPC one, used before
  // the fast socket's in each step. Both transports answer its id alike.
  v1::StepRequest third = request(2, 5);
  third.set_keep_plan(true);
  ASSERT_TRUE(by_grpc(third).ok());
  v1::StepRequest dropped = request(0, 5);
  dropped.clear_items();
  dropped.set_plan_id(ids[0]);
  absl::StatusOr<v1::StepReply> a = by_grpc(dropped), b = by_fast(dropped);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(a.status(), b.status());
  EXPECT_THAT(std::string(a.status().message()),
              HasSubstr(absl::StrCat("plan_id: this session holds no step plan ", ids[0])));
  v1::StepRequest kept = request(1, 5);
  kept.clear_items();
  kept.set_plan_id(ids[1]);
  absl::StatusOr<v1::StepReply> k = by_grpc(kept);
  EXPECT_TRUE(k.ok()) << k.status();
}

}  // namespace
}  // namespace fp4q::server::testing
