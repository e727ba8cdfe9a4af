// SPDX-License-Identifier: BSD-3-Clause
#pragma once

/// @file
/// Checkpointing a GradScaler through torch::serialize archives, beside a model and an
/// optimizer:
///
/// @code
///   torch::save(scaler, "scaler.pt");            torch::load(scaler, "scaler.pt");
///
///   torch::serialize::OutputArchive archive;     // or one archive for everything
///   model->save(archive);
///   scaler.save(archive);                        // under "lucid_amp_grad_scaler"
///   archive.save_to("checkpoint.pt");
/// @endcode
///
/// Prefer load_scaler for files: it checks the zip structure and every record's CRC-32
/// before LibTorch parses anything, and turns every failure into a c10::Error that names
/// the file. torch::load(scaler, ...) skips that check (LibTorch's reader does not verify
/// CRCs) and passes on whatever LibTorch throws (c10::Error, torch::jit::ErrorReport); a
/// corrupt TorchScript record can even crash LibTorch 1.13's importer. NOTE: [Archive
/// integrity] in src/amp/archive_check.cpp.
/// The format is described in src/amp/serialize.cpp (NOTE: [GradScaler archive format]).

#include <lucid/amp/grad_scaler.h>

#include <iosfwd>
#include <string>

namespace lucid {
namespace amp {

/// The archive key GradScaler::save writes under.
constexpr const char* kGradScalerArchiveKey = "lucid_amp_grad_scaler";
/// The format version GradScaler::save writes; load() reads versions 1..this.
constexpr int64_t kGradScalerArchiveVersion = 2;

/// Writes `scaler` into `archive` (GradScaler::save); makes torch::save(scaler, ...) work.
torch::serialize::OutputArchive& operator<<(torch::serialize::OutputArchive& archive,
                                           const GradScaler& scaler);
/// Reads `scaler` from `archive` (GradScaler::load); makes torch::load(scaler, ...) work.
torch::serialize::InputArchive& operator>>(torch::serialize::InputArchive& archive,
                                          GradScaler& scaler);

/// Saves `scaler` alone into a file (as torch::save(scaler, path)).
void save_scaler(const GradScaler& scaler, const std::string& path);
/// Saves `scaler` alone into a stream.
void save_scaler(const GradScaler& scaler, std::ostream& stream);
/// Loads `scaler` from a file written by save_scaler or torch::save. Any failure (no such
/// file, not an archive, truncated, corrupt, mismatched) throws c10::Error naming the file
/// (c10::ValueError for invalid values) and leaves the scaler unchanged.
void load_scaler(GradScaler& scaler, const std::string& path);
/// Loads `scaler` from a stream, with the same guarantees.
void load_scaler(GradScaler& scaler, std::istream& stream);

}  // namespace amp
}  // namespace lucid
