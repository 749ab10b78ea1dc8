// End to end: the hostile-input table (e2e_bad_input.h), each case answered
// with its code and a message naming the field and value, while fp4qd keeps
// serving and no state changes.
#include "e2e_bad_input.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fp4q::server::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(E2eBadInputTest, EachBadInputGetsItsCodeAndFieldAndChangesNothing) {
  // Budget: room for the baseline state only. IPC over TCP is allowed so that
  // the region RPCs' field checks are reached (the CPU backend then refuses to
  // open handles).
  auto server = ServerProcess::Start(
      {"--state_budget_bytes=20000", "--allow_cuda_ipc", "--cuda_ipc_over_tcp"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = (*server)->Stub();
  ASSERT_TRUE(CreateBaseline(*stub));
  BadEnv env;
  env.session = OpenSession(*stub, "bad-input-test");
  env.other_session = OpenSession(*stub, "another-client");
  const StateSnapshot before = TakeSnapshot(*stub);

  std::vector<BadCase> cases = TensorOpCases();
  for (auto* more : {&StateCases, &SessionCases}) {
    for (BadCase& c : (*more)()) cases.push_back(std::move(c));
  }
  EXPECT_GE(cases.size(), 120u);
  for (const BadCase& c : cases) {
    grpc::Status s = c.call(*stub, env);
    if (std::getenv("FP4Q_PRINT_CASES") != nullptr) {  // the table and its answers, for the docs
      std::fprintf(stderr, "case | %s | %d | %s\n", c.name.c_str(), s.error_code(),
                   s.error_message().c_str());
    }
    EXPECT_EQ(s.error_code(), c.code) << c.name << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(c.message)) << c.name;
    // Nothing but what the caller sent: no server paths, no other client's
    // session or name.
    EXPECT_THAT(s.error_message(), Not(HasSubstr("/tmp"))) << c.name;
    EXPECT_THAT(s.error_message(), Not(HasSubstr(env.other_session))) << c.name;
    EXPECT_THAT(s.error_message(), Not(HasSubstr("another-client"))) << c.name;
    EXPECT_TRUE(TakeSnapshot(*stub) == before) << c.name << " changed the state";
  }
  // The weight's creation step is not a retry of anything: an update there is refused.
  v1::UpdateWeightRequest dup = U("w", 5, InlineTensor(RandomF32(16 * 32, 3), 16, 32));
  v1::UpdateWeightReply dup_rep;
  auto ctx = Context();
  grpc::Status at_creation = stub->UpdateWeight(ctx.get(), dup, &dup_rep);
  EXPECT_EQ(at_creation.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(at_creation.error_message(),
              HasSubstr("step: 5 is not newer than the last step 5 of weight 'w'"));
  // Still serving, nothing changed; the process never died.
  v1::ServerInfoReply info;
  auto ictx = Context();
  EXPECT_TRUE(stub->ServerInfo(ictx.get(), v1::ServerInfoRequest(), &info).ok());
  EXPECT_TRUE(TakeSnapshot(*stub) == before);
  // A repeated applied step is a safe retry: OK, applied=false.
  dup.set_step(6);
  auto c1 = Context();
  ASSERT_TRUE(stub->UpdateWeight(c1.get(), dup, &dup_rep).ok());
  EXPECT_TRUE(dup_rep.applied());
  auto c2 = Context();
  ASSERT_TRUE(stub->UpdateWeight(c2.get(), dup, &dup_rep).ok());
  EXPECT_FALSE(dup_rep.applied());
  EXPECT_EQ(dup_rep.last_step(), 6);
}

}  // namespace
}  // namespace fp4q::server::testing
