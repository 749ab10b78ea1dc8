// libFuzzer target: the parsers of files fp4q reads from outside.
//   byte 0 % 3 == 0: common/json (ParseJson), then every accessor on the tree
//   byte 0 % 3 == 1: common/safetensors (FromBytes), then every tensor's bytes
//   and metadata;
//                    a parsed file is written back (SafetensorsWriter) and must
//                    parse again to the same tensors
//   byte 0 % 3 == 2: server/checkpoint (ReadCheckpoint of the bytes as a file):
//   a file that
//                    passes must hand over records whose sizes match its own
//                    length fields
// What counts as a bug: any sanitizer report, a crash, a hang, or a broken
// invariant below.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "fp4q/common/json.h"
#include "fp4q/common/safetensors.h"
#include "server/checkpoint.h"

namespace {

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_parsers: invariant broken: %s\n", what);
    std::abort();
  }
}

void Walk(const fp4q::common::JsonValue& v, int depth) {
  Check(depth <= fp4q::common::kMaxJsonDepth + 1, "depth limit");
  if (v.is_number()) {
    v.AsInt64().IgnoreError();
    v.AsUint64().IgnoreError();
    v.AsDouble().IgnoreError();
  }
  for (const auto& item : v.items()) Walk(item, depth + 1);
  for (const auto& [key, member] : v.members()) {
    Check(v.Find(key) != nullptr, "member found by its key");
    Walk(member, depth + 1);
  }
}

void Json(const std::string& text) {
  auto v = fp4q::common::ParseJson(text);
  if (!v.ok()) {
    Check(v.status().code() == absl::StatusCode::kInvalidArgument, "json errors are invalid");
    return;
  }
  Walk(*v, 0);
}

void Safetensors(const std::string& bytes) {
  auto f = fp4q::common::SafetensorsFile::FromBytes(bytes);
  if (!f.ok()) return;
  fp4q::common::SafetensorsWriter w;
  for (const auto& t : f->tensors()) {
    Check(t.begin <= t.end, "tensor range");
    const absl::string_view data = f->Data(t);
    Check(data.size() == t.num_bytes(), "tensor bytes");
    Check(f->Find(t.name).ok(), "tensor found by name");
    if (t.dtype == fp4q::common::StDType::kF32) {
      f->CopyTensor<float>(t.name, t.dtype).IgnoreError();
    }
    w.Add(t.name, t.dtype, t.shape, data).IgnoreError();
  }
  for (const auto& [key, value] : f->metadata()) {
    Check(f->Metadata(key).ok(), "metadata found by key");
    w.SetMetadata(key, value);
  }
  auto again = fp4q::common::SafetensorsFile::FromBytes(w.Serialize());
  Check(again.ok(), "a written file parses");
  Check(again->tensors().size() <= f->tensors().size(), "round trip keeps the tensors");
}

// The file ReadCheckpoint reads: one per process, removed at exit.
struct TempFile {
  TempFile() {
    char tmpl[] = "/tmp/fp4q_fuzz_ckpt_XXXXXX";
    const int fd = ::mkstemp(tmpl);
    Check(fd >= 0, "temp file");
    ::close(fd);
    path = tmpl;
  }
  ~TempFile() { ::unlink(path.c_str()); }
  std::string path;
};

void Checkpoint(const std::string& bytes) {
  static const TempFile file;
  const std::string& path = file.path;
  std::FILE* out = std::fopen(path.c_str(), "wb");
  Check(out != nullptr, "temp file open");
  if (!bytes.empty()) Check(std::fwrite(bytes.data(), bytes.size(), 1, out) == 1, "write");
  std::fclose(out);
  uint64_t total = 0;
  absl::Status s = fp4q::server::ReadCheckpoint(path, [&](fp4q::server::CheckpointRecord r) {
    total += r.name.size() + r.device.size() + r.codes.size() + r.scales.size() + r.residual.size();
    return absl::OkStatus();
  });
  if (s.ok()) Check(total < bytes.size(), "records fit in the file");
  if (!s.ok()) {
    Check(s.code() == absl::StatusCode::kDataLoss, "a bad checkpoint is DATA_LOSS");
    Check(total == 0, "nothing is handed over from a bad checkpoint");
  }
}

// Seeds (FP4Q_FUZZ_WRITE_SEEDS=DIR): a JSON document, a safetensors file and a checkpoint with
// a weight and a residual record, each behind its selector byte.
void WriteSeeds(const std::string& dir) {
  auto put = [&](const std::string& name, char selector, const std::string& bytes) {
    std::ofstream(dir + "/seed-" + name, std::ios::binary) << selector << bytes;
  };
  put("json", 0, R"({"a": [1, -2.5e3, "x\u00e9\n", true, false, null], "b": {"c": 18446744073709551615}})");
  fp4q::common::SafetensorsWriter w;
  const float f[4] = {1, 2, 3, 4};
  w.Add("w", fp4q::common::StDType::kF32, {2, 2}, std::string(reinterpret_cast<const char*>(f), 16))
      .IgnoreError();
  w.Add("w_scale", fp4q::common::StDType::kF8E4M3, {2, 1}, "\x38\x40").IgnoreError();
  w.SetMetadata("format", "nvfp4");
  put("safetensors", 1, w.Serialize());
  auto writer = fp4q::server::CheckpointWriter::Begin(dir, 42);
  Check(writer.ok(), "checkpoint writer");
  fp4q::server::CheckpointRecord weight;
  weight.kind = 1;
  weight.has_step = true;
  weight.block = 1;
  weight.rounding = 1;
  weight.error_feedback = true;
  weight.dtype = 1;
  weight.rows = 2;
  weight.cols = 16;
  weight.last_step = 7;
  weight.global_amax = 3.0f;
  weight.s_enc = 896.0f;
  weight.name = "w";
  weight.device = "cpu";
  weight.codes = std::string(16, '\x21');
  weight.scales = std::string(2, '\x38');
  weight.residual = std::string(2 * 16 * 4, '\0');
  fp4q::server::CheckpointRecord residual;
  residual.kind = 2;
  residual.has_step = true;
  residual.rows = 2;
  residual.cols = 16;
  residual.last_step = 3;
  residual.name = "r";
  residual.device = "cpu";
  residual.residual = std::string(2 * 16 * 4, '\x01');
  Check((*writer)->Add(weight).ok() && (*writer)->Add(residual).ok(), "checkpoint records");
  Check((*writer)->Commit().ok(), "checkpoint commit");
  const std::string path = dir + "/" + fp4q::server::kCheckpointFileName;
  std::ifstream in(path, std::ios::binary);
  put("checkpoint", 2, std::string(std::istreambuf_iterator<char>(in), {}));
  ::unlink(path.c_str());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  if (const char* dir = std::getenv("FP4Q_FUZZ_WRITE_SEEDS"); dir != nullptr && *dir != '\0') {
    WriteSeeds(dir);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0:
      Json(rest);
      break;
    case 1:
      Safetensors(rest);
      break;
    default:
      Checkpoint(rest);
      break;
  }
  return 0;
}
