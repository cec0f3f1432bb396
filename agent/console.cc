#include "agent/console.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <string>

#include "agent/posix_env.h"
#include "comm/store/text.h"

namespace dlaunch::agent {

Console::~Console() {
  if (!finished_) finish(std::chrono::milliseconds(0));
  if (direct_fd_ >= 0 && direct_fd_ != fd_) ::close(direct_fd_);
  if (!thread_.joinable()) return;
  bool idle;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    idle = state_->idle;
    state_->stop = true;
  }
  state_->cv.notify_all();
  // A writer blocked on a console that never reads cannot be woken; it
  // holds only the shared state and leaves when the write returns (or dies
  // with the process).
  if (idle) {
    thread_.join();
  } else {
    thread_.detach();
  }
}

void Console::write(std::string_view text, std::shared_ptr<Backlog> backlog) {
  if (finished_ || text.empty()) return;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->gone) return;
    // Nothing queued nor being written: no order to keep, and most text
    // needs no thread at all (a thread costs a launch of `true` workers
    // about a tenth of a millisecond).
    if (state_->idle) {
      text.remove_prefix(write_now(text));
      if (text.empty()) return;
    }
    if (backlog) backlog->queued.fetch_add(text.size());
    state_->queue.push_back(Chunk{std::string(text), std::move(backlog)});
    state_->idle = false;
    // Started under the lock: the rendezvous' progress lines come from the
    // agent's background thread while the loop may write too.
    if (!thread_.joinable()) {
      thread_ = std::thread(writer, fd_, state_);
      return;
    }
  }
  state_->cv.notify_all();
}

Console::Console(int fd) : fd_(fd) {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) return;
  if (S_ISREG(st.st_mode)) {
    direct_fd_ = fd_;  // no reader to wait for
  } else if (S_ISSOCK(st.st_mode)) {
    direct_fd_ = fd_;
    direct_socket_ = true;
  } else if (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode)) {
    const std::string self = "/proc/self/fd/" + std::to_string(fd_);
    direct_fd_ =
        ::open(self.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  }
}

size_t Console::write_now(std::string_view text) {
  if (direct_fd_ < 0) return 0;
  ssize_t n;
  do {
    n = direct_socket_ ? ::send(direct_fd_, text.data(), text.size(),
                                MSG_DONTWAIT | MSG_NOSIGNAL)
                       : ::write(direct_fd_, text.data(), text.size());
  } while (n < 0 && errno == EINTR);
  if (n >= 0) return static_cast<size_t>(n);
  if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
  state_->gone = true;  // as the writer would have found
  return text.size();
}

bool Console::same_file(int a, int b) {
  struct stat sa {
  }, sb{};
  return ::fstat(a, &sa) == 0 && ::fstat(b, &sb) == 0 &&
         sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

namespace {

// Uncharges a chunk written (or discarded) from its backlog; wakes a
// producer that waits for room.
template <typename Chunk>
void release_chunk(Chunk& c, bool gone) {
  Backlog* b = c.backlog.get();
  if (b == nullptr) return;
  size_t left = b->queued.fetch_sub(c.text.size()) - c.text.size();
  if ((left <= b->limit / 2 || gone) && b->waiting.exchange(false)) b->wake();
}

}  // namespace

// What the writer thread writes at a time.
constexpr size_t kPiece = 4096;

void Console::writer(int fd, std::shared_ptr<State> state) {
  auto release = [&](Chunk& c) { release_chunk(c, state->gone); };
  std::unique_lock<std::mutex> lock(state->mu);
  while (true) {
    state->cv.wait(lock, [&] { return !state->queue.empty() || state->stop; });
    if (state->dropped || state->queue.empty()) return;
    Chunk c = std::move(state->queue.front());
    state->queue.pop_front();
    const bool gone = state->gone;
    lock.unlock();
    // In pieces, so that finish() sees a slow reader's progress.
    bool ok = true;
    for (std::string_view rest = c.text; !gone && ok && !rest.empty();) {
      const size_t n = std::min(rest.size(), kPiece);
      ok = write_all(fd, rest.substr(0, n));
      state->written += n;
      rest.remove_prefix(n);
    }
    lock.lock();
    if (state->dropped) return;  // finish() gave up on us meanwhile
    if (!ok) {
      // The console went away: nothing more is shown, the job goes on.
      state->gone = true;
      state->queue.push_front(std::move(c));
      for (Chunk& q : state->queue) release(q);
      state->queue.clear();
    } else {
      release(c);
    }
    if (state->queue.empty()) {
      state->idle = true;
      state->cv.notify_all();
    }
  }
}

void Console::write_if_taken(std::string_view text) {
  // Only while no chunk is being written: the note must not land inside
  // one (write_now's contract).
  std::lock_guard<std::mutex> lock(state_->mu);
  if (!state_->gone && state_->idle) write_now(text);
}

size_t Console::finish(std::chrono::milliseconds timeout) {
  if (finished_) return 0;
  finished_ = true;
  std::map<std::filesystem::path, size_t> lost;  // log file -> bytes
  size_t dropped = 0;
  {
    std::unique_lock<std::mutex> lock(state_->mu);
    for (uint64_t seen = state_->written + 1; seen != state_->written;) {
      seen = state_->written;
      state_->cv.wait_for(lock, timeout, [&] {
        return state_->idle || state_->written != seen;
      });
      if (state_->idle) return 0;
    }
    state_->dropped = true;
    for (Chunk& c : state_->queue) {
      dropped += c.text.size();
      if (c.backlog && !c.backlog->log.empty()) {
        lost[c.backlog->log] += c.text.size();
      } else {
        dropped_unlogged_ += c.text.size();
      }
    }
    state_->queue.clear();
  }
  for (const auto& [path, bytes] : lost) {
    int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
    if (fd < 0) continue;
    std::string note = "\n[dlaunch: " + std::to_string(bytes) +
                       " bytes of this output never reached the console: it "
                       "accepted nothing for " +
                       comm::store::format_duration(timeout) +
                       " after the job ended; this file has them all]\n";
    write_all(fd, note);
    ::close(fd);
  }
  return dropped;
}

}  // namespace dlaunch::agent
