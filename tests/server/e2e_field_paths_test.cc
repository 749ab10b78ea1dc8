// Every field path an error message quotes exists in the proto.
//
// The hostile-input tables (e2e_bad_input.h) and a few cases of this file run
// against a CPU fp4qd through a channel whose interceptor records each call's
// method. For every INVALID_ARGUMENT answer, the message's leading field path
// ("options.outputs: ...", "input.shape[1]: ...") and every other path it
// quotes that starts at a field of the request
// ("... (options.columnwise is true)") are resolved against the request
// message's Descriptor (fp4q.v1, from the generated pool): each component a
// field of the message before it, "[i]" only on a repeated field, "." only into
// a message field. A path that does not resolve fails the test, naming the
// case, the method, the path and the message.
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "e2e_bad_input.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/support/client_interceptor.h"
#include "gtest/gtest.h"

namespace fp4q::server::testing {
namespace {

namespace gp = ::google::protobuf;

// ---- Recording the method of each call.

std::string g_last_method;  // "/fp4q.v1.Fp4q/Quantize"; the test's calls are sequential

class MethodRecorder : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* info) override {
    g_last_method = info->method();
    return nullptr;  // nothing to intercept: the method name is all we need
  }
};

std::unique_ptr<v1::Fp4q::Stub> RecordingStub(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> f;
  f.push_back(std::make_unique<MethodRecorder>());
  return v1::Fp4q::NewStub(grpc::experimental::CreateCustomChannelWithInterceptors(
      address, grpc::InsecureChannelCredentials(), args, std::move(f)));
}

// "/fp4q.v1.Fp4q/Quantize" -> fp4q.v1.QuantizeRequest's descriptor (null if
// unknown).
const gp::Descriptor* RequestType(const std::string& method) {
  std::vector<std::string> parts = absl::StrSplit(method, '/', absl::SkipEmpty());
  if (parts.size() != 2) return nullptr;
  const gp::MethodDescriptor* m =
      gp::DescriptorPool::generated_pool()->FindMethodByName(absl::StrCat(parts[0], ".", parts[1]));
  return m == nullptr ? nullptr : m->input_type();
}

// ---- Field paths.

bool IsIdentStart(char c) { return (c >= 'a' && c <= 'z') || c == '_'; }
bool IsIdent(char c) { return IsIdentStart(c) || (c >= '0' && c <= '9'); }

// The path-like token at `pos` (a lowercase identifier, then any ".ident" or
// "[digits]"), or "".
std::string TokenAt(const std::string& s, size_t pos) {
  size_t i = pos;
  if (i >= s.size() || !IsIdentStart(s[i])) return "";
  while (i < s.size()) {
    if (IsIdent(s[i])) {
      ++i;
    } else if (s[i] == '.' && i + 1 < s.size() && IsIdentStart(s[i + 1])) {
      ++i;
    } else if (s[i] == '[') {
      size_t j = i + 1;
      while (j < s.size() && s[j] >= '0' && s[j] <= '9') ++j;
      if (j == i + 1 || j >= s.size() || s[j] != ']') break;
      i = j + 1;
    } else {
      break;
    }
  }
  return s.substr(pos, i - pos);
}

// Why `path` does not name a field below `type`, or "" when it does.
std::string Unresolved(const gp::Descriptor* type, const std::string& path) {
  const gp::Descriptor* at = type;
  std::vector<std::string> parts = absl::StrSplit(path, '.');
  for (size_t k = 0; k < parts.size(); ++k) {
    std::string name = parts[k];
    bool indexed = false;
    if (const size_t b = name.find('['); b != std::string::npos) {
      indexed = true;
      name = name.substr(0, b);
      if (parts[k].find('[', b + 1) != std::string::npos) return "two indices on one field";
    }
    if (at == nullptr) return absl::StrCat("'", parts[k - 1], "' is not a message");
    const gp::FieldDescriptor* f = at->FindFieldByName(name);
    if (f == nullptr) {
      if (!indexed && k + 1 == parts.size() && at->FindOneofByName(name) != nullptr) return "";
      return absl::StrCat(at->full_name(), " has no field '", name, "'");
    }
    if (indexed && !f->is_repeated()) {
      return absl::StrCat(f->full_name(), " is not repeated (indexed as '", parts[k], "')");
    }
    at = f->type() == gp::FieldDescriptor::TYPE_MESSAGE ? f->message_type() : nullptr;
    if (f->is_repeated() && !indexed && k + 1 < parts.size()) {
      return absl::StrCat(f->full_name(), " is repeated; '.' needs an index first");
    }
  }
  return "";
}

struct Finding {
  std::string path;
  std::string why;
};

// The leading path and every path quoted later whose first component is a field
// of `type`.
std::vector<Finding> CheckMessage(const gp::Descriptor* type, const std::string& message,
                                  bool* has_leading) {
  std::vector<Finding> out;
  const std::string lead = TokenAt(message, 0);
  *has_leading = !lead.empty() && message.size() > lead.size() &&
                 (message[lead.size()] == ':' || message[lead.size()] == ' ');
  if (*has_leading) {
    if (std::string why = Unresolved(type, lead); !why.empty()) out.push_back({lead, why});
  }
  for (size_t i = lead.empty() ? 1 : lead.size(); i < message.size(); ++i) {
    if (!IsIdentStart(message[i]) || IsIdent(message[i - 1]) || message[i - 1] == '.' ||
        message[i - 1] == '\'' || message[i - 1] == '"') {
      continue;  // not a token start; quoted strings are the caller's own
                 // values
    }
    const std::string t = TokenAt(message, i);
    i += t.size();
    if (t.find_first_of(".[") == std::string::npos) continue;  // a plain word
    const std::string first = t.substr(0, t.find_first_of(".["));
    if (type->FindFieldByName(first) == nullptr) continue;  // not a path of this request
    if (std::string why = Unresolved(type, t); !why.empty()) out.push_back({t, why});
  }
  return out;
}

// ---- Cases of this file: messages the tables do not reach.

std::vector<BadCase> ExtraCases() {
  using Code = grpc::StatusCode;
  const v1::Tensor x16 = InlineTensor(RandomF32(16 * 32, 11), 16, 32);
  return {
      // The case: error feedback with both outputs named
      // options.columnwise.
      {"Quantize residual_key with OUTPUTS_BOTH",
       [x16](auto& s, auto&) {
         v1::QuantizeRequest r = Q(x16);
         r.mutable_options()->set_residual_key("ef:both");
         r.mutable_options()->set_step(1);
         r.mutable_options()->set_outputs(v1::OUTPUTS_BOTH);
         return Call(s, r);
       },
       Code::INVALID_ARGUMENT,
       "options.outputs: OUTPUTS_BOTH, but error feedback "
       "(options.residual_key) is row-wise "
       "only; use OUTPUTS_ROWWISE"},
      {"Quantize residual_key with OUTPUTS_COLUMNWISE",
       [x16](auto& s, auto&) {
         v1::QuantizeRequest r = Q(x16);
         r.mutable_options()->set_residual_key("ef:cw");
         r.mutable_options()->set_step(1);
         r.mutable_options()->set_outputs(v1::OUTPUTS_COLUMNWISE);
         return Call(s, r);
       },
       Code::INVALID_ARGUMENT,
       "options.outputs: OUTPUTS_COLUMNWISE, but error feedback "
       "(options.residual_key)"},
      {"Quantize residual_key with RHT",
       [x16](auto& s, auto&) {
         v1::QuantizeRequest r = Q(x16);
         r.mutable_options()->set_residual_key("ef:rht");
         r.mutable_options()->set_step(1);
         r.mutable_options()->set_rht(v1::RHT_MODE_DEFAULT_SIGNS);
         return Call(s, r);
       },
       Code::INVALID_ARGUMENT,
       "options.residual_key: error feedback is not combined with options.rht "
       "default_signs"},
      {"Qdq residual_key with OUTPUTS_BOTH",
       [x16](auto& s, auto&) {
         v1::QdqRequest r = Qdq(x16, "ef:qdq", 1);
         r.mutable_options()->set_outputs(v1::OUTPUTS_BOTH);
         return Call(s, r);
       },
       Code::INVALID_ARGUMENT,
       "options.outputs: OUTPUTS_BOTH, but error feedback "
       "(options.residual_key) is row-wise"},
  };
}

// A stored weight as a Matmul operand: the kernels' "b.cols" must not become a path below the
// string weight_name; the engine names its dimensions "b.weight_name (the weight's columns)".
std::vector<BadCase> StoredOperandCases() {
  using Code = grpc::StatusCode;
  return {
      // Stored weights as Matmul operands: their shape is the weight's, not a request field.
      {"Matmul K mismatch with a stored weight as b",
       [](auto& s, auto&) {
         v1::MatmulRequest r;
         *r.mutable_a()->mutable_tensor() = ZeroOperand(2, 16);
         r.mutable_b()->set_weight_name("w");
         return Call(s, r);
       },
       Code::INVALID_ARGUMENT, "b."},
      {"Matmul K mismatch with a stored weight as a",
       [](auto& s, auto&) {
         v1::MatmulRequest r;
         r.mutable_a()->set_weight_name("w");
         *r.mutable_b()->mutable_tensor() = ZeroOperand(2, 16);
         return Call(s, r);
       },
       Code::INVALID_ARGUMENT, "b."},
  };
}

// Runs `cases` against a CPU fp4qd holding the baseline state and checks every INVALID_ARGUMENT
// message's field paths; the number of messages checked.
int CheckCases(const std::vector<BadCase>& cases) {
  auto server = ServerProcess::Start(
      {"--state_budget_bytes=20000", "--allow_cuda_ipc", "--cuda_ipc_over_tcp"});
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) return 0;
  auto stub = RecordingStub((*server)->address());
  if (!CreateBaseline(*stub)) return 0;
  BadEnv env;
  env.session = OpenSession(*stub, "field-paths-test");
  env.other_session = OpenSession(*stub, "another-client");
  int checked = 0;
  std::vector<std::string> no_leading;
  for (const BadCase& c : cases) {
    g_last_method.clear();
    const grpc::Status s = c.call(*stub, env);
    EXPECT_EQ(s.error_code(), c.code) << c.name << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), ::testing::HasSubstr(c.message)) << c.name;
    if (s.error_code() != grpc::StatusCode::INVALID_ARGUMENT) continue;
    const gp::Descriptor* type = RequestType(g_last_method);
    EXPECT_NE(type, nullptr) << c.name << ": no request type for method '" << g_last_method << "'";
    if (type == nullptr) continue;
    bool has_leading = false;
    const std::vector<Finding> bad = CheckMessage(type, s.error_message(), &has_leading);
    ++checked;
    if (!has_leading) no_leading.push_back(absl::StrCat(c.name, ": ", s.error_message()));
    for (const Finding& f : bad) {
      ADD_FAILURE() << c.name << " (" << g_last_method << "): '" << f.path
                    << "' is not a field path of " << type->full_name() << ": " << f.why
                    << "\n  message: " << s.error_message();
    }
  }
  // Every INVALID_ARGUMENT message starts with the field it is about (shared/STYLE.md).
  EXPECT_THAT(no_leading, ::testing::IsEmpty()) << absl::StrJoin(no_leading, "\n");
  return checked;
}

TEST(E2eFieldPathsTest, EveryFieldPathInAnErrorMessageExistsInTheRequest) {
  std::vector<BadCase> cases = TensorOpCases();
  for (auto* more : {&StateCases, &SessionCases, &ExtraCases}) {
    for (BadCase& c : (*more)()) cases.push_back(std::move(c));
  }
  const int checked = CheckCases(cases);
  EXPECT_GE(checked, 100) << "the tables' INVALID_ARGUMENT cases did not run";
  std::fprintf(stderr, "%d INVALID_ARGUMENT messages checked\n", checked);
}

// Stored weights as Matmul operands: the message names the weight_name field (its shape is
// the weight's, not a request field).
TEST(E2eFieldPathsTest, StoredWeightOperandsNameExistingFields) {
  EXPECT_EQ(CheckCases(StoredOperandCases()), 2);
}

// The resolver itself: what it accepts and what it refuses.
TEST(E2eFieldPathsTest, ResolverAcceptsRealPathsOnly) {
  const gp::Descriptor* q = v1::QuantizeRequest::descriptor();
  EXPECT_EQ(Unresolved(q, "options.outputs"), "");
  EXPECT_EQ(Unresolved(q, "input.shape[1]"), "");
  EXPECT_EQ(Unresolved(q, "options.residual_key"), "");
  EXPECT_THAT(Unresolved(q, "options.columnwise"),
              ::testing::HasSubstr("fp4q.v1.QuantOptions has no field 'columnwise'"));
  EXPECT_THAT(Unresolved(q, "input.dtype[0]"), ::testing::HasSubstr("is not repeated"));
  EXPECT_THAT(Unresolved(q, "x.rows"), ::testing::HasSubstr("has no field 'x'"));
  bool lead = false;
  EXPECT_THAT(CheckMessage(q,
                           "options.residual_key: error feedback is row-wise only "
                           "(options.columnwise is true)",
                           &lead),
              ::testing::SizeIs(1));
  EXPECT_TRUE(lead);
  EXPECT_THAT(CheckMessage(q, "input.shape[1]: 40 is not a multiple of 16", &lead),
              ::testing::IsEmpty());
  EXPECT_TRUE(lead);
}

}  // namespace
}  // namespace fp4q::server::testing
