// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// Starting ranks as real processes and waiting for them, with an optional deadline: a rank
// still running at the deadline is killed and reported, so a hang fails a test instead of
// stalling the suite. Every program of this repository that starts its own ranks (the
// distributed tests, bench_agreement, the data_parallel example) starts them here.
//
// A rank is a fork + exec of `exe` with its argument list. A caller that can run a rank
// in-process (the distributed tests: worker_main) may pass that function instead: the
// rank is then a fork of the calling process that calls it and _exits, which skips
// LibTorch's start-up (about a second per process on a loaded 2-core machine, which would
// make a 4-rank run take 8 s). fork() without exec is only safe while the parent has a
// single thread (no Gloo group alive, no OpenMP pool), which is checked first; otherwise,
// and whenever LUCID_TEST_EXEC_RANKS is set, the rank is a fork + exec after all.
//
// Uses no GoogleTest, so that programs other than tests can include it.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace lucid_test {

// The number of threads of this process (Linux), or -1.
inline int thread_count() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) {
      return std::stoi(line.substr(8));
    }
  }
  return -1;
}

struct RankExit {
  bool exited = false;    // ended by itself (else: killed at the deadline, or by a signal)
  int code = -1;          // exit status when `exited`
  int signal = 0;         // the signal that ended it otherwise
  bool killed_at_deadline = false;
  double seconds = 0.0;   // from spawn to exit

  // Ended by itself with status 0.
  bool succeeded() const { return exited && code == 0; }
};

class Ranks {
 public:
  // A rank's main function, for a rank run in a fork of this process.
  using Main = int (*)(int argc, char** argv);
  static constexpr double kNoDeadline = std::numeric_limits<double>::infinity();

  // Starts one rank per argument list: `exe arg...` (argv[0] is `exe`), or
  // in_process(argc, argv) with that argv in a fork of this process (see above).
  Ranks(const std::string& exe, const std::vector<std::vector<std::string>>& args,
        Main in_process = nullptr)
      : start_(std::chrono::steady_clock::now()) {
    const bool fork_only = in_process != nullptr && thread_count() == 1 &&
                           std::getenv("LUCID_TEST_EXEC_RANKS") == nullptr;
    std::fflush(stdout);
    std::fflush(stderr);
    for (const auto& list : args) {
      // Build argv before fork(): the exec'ing child only calls execv and _exit.
      std::vector<std::string> strings{exe};
      strings.insert(strings.end(), list.begin(), list.end());
      std::vector<char*> argv;
      for (auto& s : strings) {
        argv.push_back(s.data());
      }
      argv.push_back(nullptr);
      const pid_t pid = fork();
      if (pid < 0) {
        throw std::runtime_error("fork failed");
      }
      if (pid == 0) {
        if (fork_only) {
          _exit(in_process(static_cast<int>(strings.size()), argv.data()));
        }
        execv(exe.c_str(), argv.data());
        _exit(127);
      }
      pids_.push_back(pid);
    }
  }

  Ranks(const Ranks&) = delete;
  Ranks& operator=(const Ranks&) = delete;

  ~Ranks() {
    for (pid_t pid : pids_) {
      if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
    }
  }

  // Waits for every rank until `deadline_s` after the spawn; kills the rest then.
  std::vector<RankExit> wait(double deadline_s = kNoDeadline) {
    std::vector<RankExit> exits(pids_.size());
    size_t running = pids_.size();
    while (running > 0) {
      const double now =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      for (size_t i = 0; i < pids_.size(); ++i) {
        if (pids_[i] <= 0) {
          continue;
        }
        int status = 0;
        const bool past_deadline = now > deadline_s;
        if (past_deadline) {
          kill(pids_[i], SIGKILL);
          exits[i].killed_at_deadline = true;
        }
        if (waitpid(pids_[i], &status, past_deadline ? 0 : WNOHANG) == pids_[i]) {
          exits[i].seconds = now;
          exits[i].exited = WIFEXITED(status);
          exits[i].code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
          exits[i].signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
          pids_[i] = -1;
          --running;
        }
      }
      if (running > 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    return exits;
  }

 private:
  std::chrono::steady_clock::time_point start_;
  std::vector<pid_t> pids_;
};

}  // namespace lucid_test
