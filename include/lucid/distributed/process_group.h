// SPDX-License-Identifier: BSD-3-Clause
#pragma once

/// @file
/// Small factories for c10d stores and process groups that hide the differences between
/// LibTorch versions (1.13: a ProcessGroupGloo is a ProcessGroup; 2.x: it is a Backend
/// wrapped in one). Every blocking step is bounded by a timeout and fails with a
/// c10::Error that says which rank waited for what.

#include <c10/util/intrusive_ptr.h>
#include <torch/arg.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <string>

namespace lucid {
namespace distributed {

/// Options of make_gloo_group / make_nccl_group.
struct GroupOptions {
  /// Bound on the rendezvous and on every collective of the backend: > 0.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::seconds(60);
  /// Gloo only: the address to bind ("127.0.0.1" for ranks on one machine); empty means
  /// Gloo's default device (this machine's hostname, else loopback).
  TORCH_ARG(std::string, gloo_hostname) = "";
};

/// A c10d::FileStore at `path` (a file on a filesystem all ranks share) for `world_size`
/// ranks, whose waits time out after `timeout`.
c10::intrusive_ptr<c10d::Store> make_file_store(const std::string& path, int world_size,
                                                std::chrono::milliseconds timeout);

/// A c10d::TCPStore at host:port; rank 0 passes `is_server` = true and hosts it. A client
/// that cannot reach it within `timeout` gets a c10::Error naming the address.
c10::intrusive_ptr<c10d::Store> make_tcp_store(const std::string& host, uint16_t port,
                                               int world_size, bool is_server,
                                               std::chrono::milliseconds timeout);

/// Whether this build of lucid_amp::distributed can make Gloo groups.
bool has_gloo();
/// Whether this build of lucid_amp::distributed can make NCCL groups.
bool has_nccl();

/// A Gloo process group (CPU tensors) of `world_size` ranks over `store`. Blocks until
/// every rank joined; throws c10::Error if that does not happen within the timeout, and
/// c10::NotImplementedError if this build has no Gloo.
c10::intrusive_ptr<c10d::ProcessGroup> make_gloo_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                       int rank, int world_size,
                                                       GroupOptions options = {});

/// An NCCL process group (CUDA tensors; one GPU per rank) over `store`; its collectives
/// are bounded by the NCCL watchdog at `options.timeout`. Throws
/// c10::NotImplementedError if this build has no NCCL.
c10::intrusive_ptr<c10d::ProcessGroup> make_nccl_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                       int rank, int world_size,
                                                       GroupOptions options = {});

}  // namespace distributed
}  // namespace lucid
