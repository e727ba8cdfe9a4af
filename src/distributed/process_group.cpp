// SPDX-License-Identifier: BSD-3-Clause
// Store and process-group factories: argument checks, the backend's own constructors,
// and errors that say which rank waited for what. Gloo and NCCL are compiled only where
// their headers exist (LUCID_AMP_HAS_GLOO / LUCID_AMP_HAS_NCCL, set by CMakeLists.txt with
// their USE_C10D_* twins, which guard LibTorch's own headers).

#include <lucid/distributed/process_group.h>

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef LUCID_AMP_HAS_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#ifdef LUCID_AMP_HAS_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <c10/util/StringUtil.h>

#include <exception>
#include <initializer_list>
#include <string>

namespace lucid {
namespace distributed {
namespace {

// A freshly built c10d backend (ProcessGroupGloo or ProcessGroupNCCL) as the
// c10d::ProcessGroup users pass around, serving tensors of the given device types as
// torch.distributed does (Gloo: CPU and CUDA tensors; NCCL: CUDA ones). The timeout lives
// in the backend's own options.
[[maybe_unused]] c10::intrusive_ptr<c10d::ProcessGroup> as_process_group(
    const c10::intrusive_ptr<c10d::Backend>& backend, const c10::intrusive_ptr<c10d::Store>& store,
    int rank, int size, std::initializer_list<c10::DeviceType> device_types,
    c10d::ProcessGroup::BackendType type) {
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, size);
  group->setDefaultBackend(type);
  for (const c10::DeviceType device_type : device_types) {
    group->setBackend(device_type, type, backend);
  }
  return group;
}

double seconds(std::chrono::milliseconds ms) { return static_cast<double>(ms.count()) / 1000.0; }

void check_world(const char* who, int world_size, std::chrono::milliseconds timeout) {
  TORCH_CHECK_VALUE(world_size >= 1, who, ": world_size must be >= 1, got ", world_size, ".");
  TORCH_CHECK_VALUE(timeout.count() > 0, who, ": timeout must be > 0 ms, got ", timeout.count(),
                    " ms.");
}

void check_rank(const char* who, const c10::intrusive_ptr<c10d::Store>& store, int rank,
                int world_size, std::chrono::milliseconds timeout) {
  check_world(who, world_size, timeout);
  TORCH_CHECK_VALUE(store, who, ": the store is null; make one with make_file_store or "
                            "make_tcp_store.");
  TORCH_CHECK_VALUE(rank >= 0 && rank < world_size, who, ": rank must be in [0, ", world_size,
                    "), got ", rank, ".");
}

// The message of whatever a c10d constructor threw, without LibTorch's C++ backtrace.
std::string cause_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

// Runs a group's construction (its rendezvous) and turns whatever it throws into one
// c10::Error: "<what> of <world_size> <failure>: <cause><advice>".
template <typename Make>
c10::intrusive_ptr<c10d::ProcessGroup> create_group(int rank, int world_size,
                                                    const std::string& failure, const char* advice,
                                                    Make make) {
  try {
    return make();
  } catch (...) {
    TORCH_CHECK(false, "lucid::distributed: rank ", rank, " of ", world_size, " ", failure, ": ",
                cause_of(std::current_exception()), advice);
  }
}

}  // namespace

c10::intrusive_ptr<c10d::Store> make_file_store(const std::string& path, int world_size,
                                                std::chrono::milliseconds timeout) {
  check_world("make_file_store", world_size, timeout);
  try {
    auto store = c10::make_intrusive<c10d::FileStore>(path, world_size);
    store->setTimeout(timeout);
    return store;
  } catch (...) {
    TORCH_CHECK(false, "lucid::distributed: cannot open the c10d FileStore at '", path,
                "': ", cause_of(std::current_exception()),
                ". Pass a path on a filesystem every rank can write.");
  }
}

c10::intrusive_ptr<c10d::Store> make_tcp_store(const std::string& host, uint16_t port,
                                               int world_size, bool is_server,
                                               std::chrono::milliseconds timeout) {
  check_world("make_tcp_store", world_size, timeout);
  c10d::TCPStoreOptions opts;
  opts.port = port;
  opts.isServer = is_server;
  opts.numWorkers = static_cast<std::size_t>(world_size);
  opts.waitWorkers = false;  // the group's rendezvous waits for the ranks, with its timeout
  opts.timeout = timeout;
  try {
    return c10::make_intrusive<c10d::TCPStore>(host, opts);
  } catch (...) {
    const std::string cause = cause_of(std::current_exception());
    TORCH_CHECK(!is_server, "lucid::distributed: cannot host the c10d TCPStore at ", host, ":",
                port, ": ", cause, ". Is the port already in use?");
    TORCH_CHECK(false, "lucid::distributed: cannot reach the c10d TCPStore at ", host, ":", port,
                " within ", seconds(timeout), " s: ", cause,
                ". Is rank 0 running and serving the store at that address?");
  }
}

bool has_gloo() {
#ifdef LUCID_AMP_HAS_GLOO
  return true;
#else
  return false;
#endif
}

bool has_nccl() {
#ifdef LUCID_AMP_HAS_NCCL
  return true;
#else
  return false;
#endif
}

c10::intrusive_ptr<c10d::ProcessGroup> make_gloo_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                       int rank, int world_size,
                                                       GroupOptions options) {
  check_rank("make_gloo_group", store, rank, world_size, options.timeout());
#ifdef LUCID_AMP_HAS_GLOO
  return create_group(
      rank, world_size,
      c10::str("could not join the Gloo group within ", seconds(options.timeout()), " s"),
      ". Did every rank start, with the same store and world size?", [&] {
        auto gloo_options = c10d::ProcessGroupGloo::Options::create(options.timeout());
        gloo_options->devices.push_back(
            options.gloo_hostname().empty()
                ? c10d::ProcessGroupGloo::createDefaultDevice()
                : c10d::ProcessGroupGloo::createDeviceForHostname(options.gloo_hostname()));
        // The constructor is the rendezvous: it returns once every rank has connected.
        auto backend =
            c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, gloo_options);
        return as_process_group(backend, store, rank, world_size,
                                {c10::DeviceType::CPU, c10::DeviceType::CUDA},
                                c10d::ProcessGroup::BackendType::GLOO);
      });
#else
  TORCH_CHECK_NOT_IMPLEMENTED(false,
                              "make_gloo_group: this lucid_amp::distributed was built without "
                              "Gloo (c10d's ProcessGroupGloo.hpp or the gloo headers were not "
                              "found; reconfigure with LUCID_AMP_GLOO_INCLUDE_DIR).");
#endif
}

c10::intrusive_ptr<c10d::ProcessGroup> make_nccl_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                       int rank, int world_size,
                                                       GroupOptions options) {
  check_rank("make_nccl_group", store, rank, world_size, options.timeout());
#ifdef LUCID_AMP_HAS_NCCL
  return create_group(rank, world_size, "could not create the NCCL group", ".", [&] {
    auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
    nccl_options->timeout = options.timeout();  // the watchdog's bound on every collective
    auto backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size, nccl_options);
    return as_process_group(backend, store, rank, world_size, {c10::DeviceType::CUDA},
                            c10d::ProcessGroup::BackendType::NCCL);
  });
#else
  TORCH_CHECK_NOT_IMPLEMENTED(false,
                              "make_nccl_group: this lucid_amp::distributed was built without "
                              "NCCL (it needs a CUDA LibTorch, c10d's ProcessGroupNCCL.hpp and "
                              "nccl.h; see LUCID_AMP_WITH_NCCL).");
#endif
}

}  // namespace distributed
}  // namespace lucid
