// Engine persistence: Checkpoint (snapshot every live entry under its lock, on its device's
// executor, streamed into checkpoint.h's file) and Restore (verify, then load).
#include <chrono>
#include <future>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "fp4q/common/status_macros.h"
#include "server/engine.h"
#include "server/request_checks.h"

namespace fp4q::server {
namespace {

absl::Status Corrupt(const CheckpointRecord& r, absl::string_view what) {
  return absl::DataLossError(
      absl::StrCat("checkpoint is corrupt: record '", r.name.substr(0, 64), "': ", what));
}

}  // namespace

absl::StatusOr<CheckpointRecord> Engine::Snapshot(const std::shared_ptr<StateEntry>& e,
                                                   CheckpointRecord reuse) {
  auto promise = std::make_shared<std::promise<absl::StatusOr<CheckpointRecord>>>();
  std::future<absl::StatusOr<CheckpointRecord>> future = promise->get_future();
  auto spare = std::make_shared<CheckpointRecord>(std::move(reuse));
  auto copy = [e, spare](kernels::Backend& backend,
                         kernels::Stream stream) -> absl::StatusOr<CheckpointRecord> {
    std::lock_guard<std::mutex> lock(e->op_mu);
    CheckpointRecord r;
    if (!e->live.load()) return r;  // deleted meanwhile: kind 0, skipped
    // `n` bytes in the spare buffer `from` (its capacity kept), moved into `*to`.
    const auto sized = [](std::string* to, std::string* from, size_t n) {
      *to = std::move(*from);
      to->clear();
      to->resize(n);
    };
    r.kind = static_cast<uint8_t>(e->kind);
    r.has_step = e->has_step.load();
    r.last_step = e->last_step.load();
    r.rows = e->rows;
    r.cols = e->cols;
    r.name = e->name;
    r.device = e->device->label;
    if (e->kind == EntryKind::kWeight) {
      r.block = e->params.block == kernels::BlockShape::k16x16 ? kRecordBlock16x16
                                                               : kRecordBlock1x16;
      r.rounding = e->params.rounding == kernels::Rounding::kStochastic ? kRecordStochastic
                                                                        : kRecordNearest;
      r.error_feedback = e->params.error_feedback;
      r.dtype = e->params.dtype == kernels::DType::kBF16 ? kRecordBF16 : kRecordF32;
      r.seed = e->params.seed;
      sized(&r.codes, &spare->codes, e->sizes.codes);
      sized(&r.scales, &spare->scales, e->sizes.scales);
      float g[kernels::kGlobalFloats];
      FP4Q_RETURN_IF_ERROR(
          backend.CopyToHost(r.codes.data(), e->codes.data(), r.codes.size(), stream));
      FP4Q_RETURN_IF_ERROR(
          backend.CopyToHost(r.scales.data(), e->scales.data(), r.scales.size(), stream));
      FP4Q_RETURN_IF_ERROR(backend.CopyToHost(g, e->global.data(), sizeof(g), stream));
      if (!e->stats.empty()) {
        FP4Q_RETURN_IF_ERROR(backend.CopyToHost(r.stats, e->stats.data(), sizeof(r.stats), stream));
      }
      FP4Q_RETURN_IF_ERROR(backend.Synchronize(stream));
      r.global_amax = g[0];
      r.s_enc = g[1];
      r.scaling = e->params.scaling == kernels::Scaling::kDelayed ? 2 : 1;
      const OptimizerSpec& spec = e->optimizer.spec();
      r.optimizer = spec.kind == kernels::OptimizerKind::kAdamW ? 2 : 1;
      r.momentum = spec.momentum;
      r.amsgrad = spec.amsgrad;
      r.state_dtype = spec.dtype == kernels::StateDType::kBF16    ? 2
                      : spec.dtype == kernels::StateDType::kNvfp4 ? 3
                                                                  : 1;
      r.optimizer_steps = e->optimizer_steps;
      r.last_hyper_hash = e->last_hyper_hash;
      r.fingerprints = e->last_fingerprints;
      for (int i = 0; i < spec.moments(); ++i) {
        const OptimizerStorage::Moment& m = e->optimizer.moments()[static_cast<size_t>(i)];
        std::string bytes;
        if (spare->moments.size() <= static_cast<size_t>(i)) spare->moments.resize(i + 1);
        std::string* from = &spare->moments[static_cast<size_t>(i)];
        if (spec.dtype == kernels::StateDType::kNvfp4) {
          sized(&bytes, from, m.codes.size() + m.scales.size() + m.global.size());
          FP4Q_RETURN_IF_ERROR(
              backend.CopyToHost(bytes.data(), m.codes.data(), m.codes.size(), stream));
          FP4Q_RETURN_IF_ERROR(backend.CopyToHost(bytes.data() + m.codes.size(), m.scales.data(),
                                                  m.scales.size(), stream));
          FP4Q_RETURN_IF_ERROR(
              backend.CopyToHost(bytes.data() + m.codes.size() + m.scales.size(), m.global.data(),
                                 m.global.size(), stream));
        } else {
          sized(&bytes, from, m.dense.size());
          FP4Q_RETURN_IF_ERROR(
              backend.CopyToHost(bytes.data(), m.dense.data(), m.dense.size(), stream));
        }
        r.moments.push_back(std::move(bytes));
      }
    }
    if (!e->residual.empty()) {
      sized(&r.residual, &spare->residual, e->sizes.residual);
      FP4Q_RETURN_IF_ERROR(
          backend.CopyToHost(r.residual.data(), e->residual.data(), r.residual.size(), stream));
    }
    FP4Q_RETURN_IF_ERROR(backend.Synchronize(stream));
    return r;
  };
  Device* device = e->device;
  absl::Status queued = ExecutorFor(*device).Submit(
      RequestContext{},
      [promise, copy, device](kernels::Stream stream) {
        promise->set_value(copy(*device->backend, stream));
      },
      [promise](absl::Status s) { promise->set_value(s); }, /*bypass_bound=*/true);
  if (!queued.ok()) return queued;
  return future.get();
}

absl::StatusOr<CheckpointStats> Engine::CheckpointNow() {
  if (options_.state_dir.empty()) {
    return absl::FailedPreconditionError(
        "Checkpoint: this server keeps no state directory (start fp4qd with --state_dir)");
  }
  std::lock_guard<std::mutex> lock(checkpoint_mu_);
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<CheckpointStats> result = [&]() -> absl::StatusOr<CheckpointStats> {
    FP4Q_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointWriter> writer,
                          CheckpointWriter::Begin(options_.state_dir, epoch_));
    CheckpointRecord spare;  // the last record written: its buffers serve the next one
    for (const auto& e : store_->Entries()) {
      FP4Q_ASSIGN_OR_RETURN(CheckpointRecord r, Snapshot(e, std::move(spare)));
      if (r.kind == 0) continue;
      FP4Q_RETURN_IF_ERROR(writer->Add(r));
      spare = std::move(r);
    }
    return writer->Commit();
  }();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (observer_ != nullptr) observer_->CheckpointFinished(result.ok(), seconds, absl::Now());
  if (result.ok()) {
    logger_->Info("checkpoint written", {{"file", options_.state_dir + "/" + result->file_name},
                                         {"bytes", absl::StrCat(result->bytes)},
                                         {"tensors", absl::StrCat(result->records)},
                                         {"seconds", absl::StrCat(seconds)}});
  } else {
    logger_->Error("checkpoint failed",
                   {{"dir", options_.state_dir}, {"error", result.status().ToString()}});
  }
  return result;
}

absl::Status Engine::RestoreRecord(CheckpointRecord r) {
  if (r.kind != 1 && r.kind != 2) return Corrupt(r, absl::StrCat("kind ", r.kind));
  if (!CheckName(LocalName(r.name), "name").ok() ||
      !CheckNamespace(NamespaceOf(r.name), "namespace").ok()) {
    return Corrupt(r, "bad name");
  }
  if (r.rows < 1 || r.cols < 1) return Corrupt(r, "bad shape");
  const EntryKind kind = static_cast<EntryKind>(r.kind);
  WeightParams params;
  if (kind == EntryKind::kWeight) {
    if (r.block != kRecordBlock1x16 && r.block != kRecordBlock16x16) {
      return Corrupt(r, "bad block");
    }
    if (r.rounding != kRecordNearest && r.rounding != kRecordStochastic) {
      return Corrupt(r, "bad rounding");
    }
    if (r.dtype != kRecordF32 && r.dtype != kRecordBF16) return Corrupt(r, "bad dtype");
    params.block =
        r.block == kRecordBlock16x16 ? kernels::BlockShape::k16x16 : kernels::BlockShape::k1x16;
    params.rounding = r.rounding == kRecordStochastic ? kernels::Rounding::kStochastic
                                                      : kernels::Rounding::kNearest;
    params.dtype = r.dtype == kRecordBF16 ? kernels::DType::kBF16 : kernels::DType::kF32;
    params.seed = r.seed;
    params.error_feedback = r.error_feedback;
    params.scaling = r.scaling == 2 ? kernels::Scaling::kDelayed : kernels::Scaling::kCurrent;
  }
  OptimizerSpec spec;
  if (kind == EntryKind::kWeight) {
    spec.kind = r.optimizer == 2 ? kernels::OptimizerKind::kAdamW : kernels::OptimizerKind::kSgd;
    spec.momentum = r.momentum;
    spec.amsgrad = r.amsgrad;
    spec.dtype = r.state_dtype == 2   ? kernels::StateDType::kBF16
                 : r.state_dtype == 3 ? kernels::StateDType::kNvfp4
                                      : kernels::StateDType::kF32;
    if (static_cast<int>(r.moments.size()) != spec.moments()) {
      return Corrupt(r, "its optimizer state does not match its optimizer");
    }
  }
  absl::StatusOr<EntrySizes> sizes = SizesFor(kind, r.rows, r.cols, params, "shape");
  if (!sizes.ok()) return Corrupt(r, sizes.status().message());
  if (r.codes.size() != sizes->codes || r.scales.size() != sizes->scales ||
      r.residual.size() != sizes->residual) {
    return Corrupt(r, "part sizes do not match its shape");
  }
  Device* device = devices_->FindByUuid(r.device);
  if (device == nullptr) {
    device = LeastStateDevice();
    logger_->Warning("restored tensor moved to another device",
                     {{"name", r.name}, {"from", r.device}, {"to", device->label}});
  }
  absl::StatusOr<uint64_t> state_bytes = OptimizerStorage::BytesFor(spec, r.rows, r.cols);
  if (!state_bytes.ok()) return Corrupt(r, state_bytes.status().message());
  auto e = std::make_shared<StateEntry>(r.name, kind, device, r.rows, r.cols, params, *sizes);
  e->optimizer_bytes.store(kind == EntryKind::kWeight ? *state_bytes : 0);
  std::unique_lock<std::mutex> lock;
  absl::Status reserved = store_->Reserve(e, &lock, "checkpoint");
  if (reserved.code() == absl::StatusCode::kAlreadyExists) return Corrupt(r, "duplicate name");
  FP4Q_RETURN_IF_ERROR(reserved);
  kernels::Backend& backend = *device->backend;
  auto load = [&](DeviceBuffer* dst, const void* src, size_t n) -> absl::Status {
    if (n == 0) return absl::OkStatus();
    FP4Q_ASSIGN_OR_RETURN(*dst, DeviceBuffer::Allocate(&backend, n));
    return backend.CopyFromHost(dst->data(), src, n, nullptr);
  };
  const float g[kernels::kGlobalFloats] = {r.global_amax, r.s_enc};
  absl::Status s = load(&e->codes, r.codes.data(), r.codes.size());
  if (s.ok()) s = load(&e->scales, r.scales.data(), r.scales.size());
  if (s.ok() && kind == EntryKind::kWeight) s = load(&e->global, g, sizeof(g));
  if (s.ok()) s = load(&e->residual, r.residual.data(), r.residual.size());
  if (s.ok() && kind == EntryKind::kWeight) s = load(&e->stats, r.stats, sizeof(r.stats));
  if (s.ok() && kind == EntryKind::kWeight) {
    absl::StatusOr<OptimizerStorage> st =
        OptimizerStorage::Create(&backend, nullptr, spec, r.rows, r.cols);
    s = st.status();
    for (int i = 0; s.ok() && i < spec.moments(); ++i) {
      OptimizerStorage::Moment& m = st->moments()[static_cast<size_t>(i)];
      const std::string& bytes = r.moments[static_cast<size_t>(i)];
      const size_t want = m.dense.size() + m.codes.size() + m.scales.size() + m.global.size();
      if (bytes.size() != want) {
        s = Corrupt(r, absl::StrCat("moment ", i, " holds ", bytes.size(), " bytes, not ", want));
        break;
      }
      if (spec.dtype == kernels::StateDType::kNvfp4) {
        s = backend.CopyFromHost(m.codes.data(), bytes.data(), m.codes.size(), nullptr);
        if (s.ok()) {
          s = backend.CopyFromHost(m.scales.data(), bytes.data() + m.codes.size(),
                                   m.scales.size(), nullptr);
        }
        if (s.ok()) {
          s = backend.CopyFromHost(m.global.data(),
                                   bytes.data() + m.codes.size() + m.scales.size(),
                                   m.global.size(), nullptr);
        }
      } else {
        s = backend.CopyFromHost(m.dense.data(), bytes.data(), bytes.size(), nullptr);
      }
    }
    if (s.ok()) e->optimizer = *std::move(st);
    e->optimizer_steps = r.optimizer_steps;
    e->last_hyper_hash = r.last_hyper_hash;
    e->last_fingerprints = r.fingerprints;
  }
  if (s.ok()) s = backend.Synchronize(nullptr);
  if (!s.ok()) {
    store_->Drop(e);
    return s;
  }
  e->last_step.store(r.last_step);
  e->has_step.store(r.has_step);
  store_->Publish(e);
  return absl::OkStatus();
}

absl::Status Engine::Restore() {
  if (options_.state_dir.empty()) return absl::OkStatus();
  const std::string path = absl::StrCat(options_.state_dir, "/", kCheckpointFileName);
  // Each record's meaning is checked (checkpoint.h) before it is loaded; the first impossible
  // one fails the restore and the rollback below unloads the records before it.
  uint32_t index = 0;
  absl::Status s = ReadCheckpoint(path, [this, &index](CheckpointRecord r) -> absl::Status {
    FP4Q_RETURN_IF_ERROR(ValidateCheckpointRecord(r, index++));
    return RestoreRecord(std::move(r));
  });
  if (absl::IsNotFound(s)) {
    logger_->Info("no checkpoint to restore; starting empty", {{"file", path}});
    return absl::OkStatus();
  }
  if (!s.ok()) {
    for (const auto& e : store_->Entries()) {  // all or nothing
      std::lock_guard<std::mutex> lock(e->op_mu);
      store_->Drop(e);
    }
    logger_->Error("checkpoint not restored", {{"file", path}, {"error", s.ToString()}});
    return s;
  }
  const auto entries = store_->Entries();
  logger_->Info("checkpoint restored", {{"file", path}, {"tensors", absl::StrCat(entries.size())}});
  return absl::OkStatus();
}

void Engine::Checkpoint(const RequestContext& ctx, Done<CheckpointResult> done) {
  Control<CheckpointResult>(ctx, std::move(done), [this]() -> absl::StatusOr<CheckpointResult> {
    FP4Q_ASSIGN_OR_RETURN(CheckpointStats stats, CheckpointNow());
    CheckpointResult r;
    r.file_name = stats.file_name;
    r.bytes = stats.bytes;
    r.tensors = stats.records;
    return r;
  });
}

}  // namespace fp4q::server
