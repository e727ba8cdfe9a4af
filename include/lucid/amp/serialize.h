#pragma once

// Checkpointing a GradScaler through torch::serialize archives, beside a model and an
// optimizer:
//
//   torch::save(scaler, "scaler.pt");            torch::load(scaler, "scaler.pt");
//
//   torch::serialize::OutputArchive archive;     // or one archive for everything
//   model->save(archive);
//   scaler.save(archive);                        // under "lucid_amp_grad_scaler"
//   archive.save_to("checkpoint.pt");
//
// The format (version 1) is described in src/amp/serialize.cpp.

#include <lucid/amp/grad_scaler.h>

namespace lucid {
namespace amp {

/// The archive key GradScaler::save writes under.
constexpr const char* kGradScalerArchiveKey = "lucid_amp_grad_scaler";
/// The format version GradScaler::save writes; load() reads versions 1..this.
constexpr int64_t kGradScalerArchiveVersion = 1;

/// Writes `scaler` into `archive` (GradScaler::save); makes torch::save(scaler, ...) work.
torch::serialize::OutputArchive& operator<<(torch::serialize::OutputArchive& archive,
                                           const GradScaler& scaler);
/// Reads `scaler` from `archive` (GradScaler::load); makes torch::load(scaler, ...) work.
torch::serialize::InputArchive& operator>>(torch::serialize::InputArchive& archive,
                                          GradScaler& scaler);

}  // namespace amp
}  // namespace lucid
