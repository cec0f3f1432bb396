#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

namespace dlaunch::agent {

// What one source (a worker's stream) has waiting for the console: its
// producer stops reading the worker while `queued` is at `limit` and sets
// `waiting`; the writer calls `wake` (from its own thread, once) when the
// backlog has drained to half the limit. `log` is where a note goes if the
// backlog is dropped at the end.
struct Backlog {
  size_t limit = 0;  // set before the first write
  std::atomic<size_t> queued{0};
  std::atomic<bool> waiting{false};
  std::function<void()> wake;  // set before the first write; thread-safe
  std::filesystem::path log;   // may be empty
  size_t dropped = 0;          // under the console's lock
};

// One console stream (fd 1 or 2) that never blocks the agent's event loop
// on a terminal, pipe or ssh session that stops reading: text is written at
// once without blocking while the console takes it, and what it does not
// take goes to a thread of its own (started then), which writes it in
// order. A console that went away (EPIPE or any other write error) stops
// console output, not the job: later text is discarded. Methods are called
// from one thread (the event loop's); the writer thread touches only the
// queue.
class Console {
 public:
  explicit Console(int fd);
  // Ends the writer without waiting for a write that the console blocks:
  // a thread stuck there is left to die with the process.
  ~Console();
  Console(const Console&) = delete;
  Console& operator=(const Console&) = delete;

  // Queues `text` (whole lines) for the console, charged to `backlog` when
  // given. Never blocks.
  void write(std::string_view text, std::shared_ptr<Backlog> backlog = {});

  // Waits for everything queued to be written while the console takes some
  // of it every `timeout` (a slow reader gets all; one that stopped, at most
  // `timeout`), then drops what is left, appending a note to the log file of
  // each source that lost output. Returns the bytes dropped. Later writes
  // are discarded.
  size_t finish(std::chrono::milliseconds timeout);
  // Of the bytes finish() dropped, those no log file holds either.
  size_t dropped_unlogged() const { return dropped_unlogged_; }
  // Writes `text` if the console takes it at once (a last word after
  // finish(); a stalled console loses it).
  void write_if_taken(std::string_view text);

  // Whether fds `a` and `b` are one file (`2>&1`, one terminal): they must
  // share one Console, or their lines could be cut into each other.
  static bool same_file(int a, int b);

 private:
  struct Chunk {
    std::string text;
    std::shared_ptr<Backlog> backlog;
  };
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Chunk> queue;
    bool stop = false;     // writer: leave once idle (or at once if dropped)
    bool dropped = false;  // finish() gave up: nothing more is written
    bool gone = false;     // the console failed: discard everything
    bool idle = true;      // nothing queued and no write in progress
    // Bytes the writer wrote: finish() sees progress.
    std::atomic<uint64_t> written{0};
  };
  static void writer(int fd, std::shared_ptr<State> state);
  // Writes what of `text` the console takes without blocking; the bytes
  // written (all of them when it failed: they are discarded). Called with
  // the state's lock held and nothing queued.
  size_t write_now(std::string_view text);

  int fd_;
  // For write_now: fd_ itself for a regular file or a socket (send with
  // MSG_DONTWAIT), else fd_ reopened with O_NONBLOCK (a flag of our own
  // open file, not of the one shared with our parent); -1 when neither
  // works (every write goes through the thread). Opened with the console,
  // so that the agent's open files stay the same from its start.
  int direct_fd_ = -1;
  bool direct_socket_ = false;
  std::shared_ptr<State> state_ = std::make_shared<State>();
  std::thread thread_;
  bool finished_ = false;
  size_t dropped_unlogged_ = 0;
};

}  // namespace dlaunch::agent
