#include "launcher/remote_job.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>

namespace dlaunch::launcher {
namespace {

constexpr std::string_view kMagic = "dlaunch-job 1\n";
constexpr size_t kMaxRecord = size_t{64} << 20;  // one field, 64 MiB

void record(std::string& out, std::string_view kind, std::string_view value) {
  out += kind;
  out += ' ';
  out += std::to_string(value.size());
  out += '\n';
  out += value;
  out += '\n';
}

// Cuts records off the front of `text`.
class Reader {
 public:
  explicit Reader(std::string_view text) : text_(text) {}

  bool done() const { return text_.empty(); }

  // The next record; false when `text_` holds less than a whole one.
  bool next(std::string_view& kind, std::string_view& value) {
    size_t nl = text_.find('\n');
    if (nl == std::string_view::npos) return false;
    std::string_view head = text_.substr(0, nl);
    size_t sp = head.find(' ');
    if (sp == std::string_view::npos) {
      throw RemoteJobError("job record header '" + std::string(head) +
                           "' is not 'KIND LENGTH'");
    }
    size_t len = 0;
    std::string_view n = head.substr(sp + 1);
    auto [p, ec] = std::from_chars(n.data(), n.data() + n.size(), len);
    if (ec != std::errc() || p != n.data() + n.size() || len > kMaxRecord) {
      throw RemoteJobError("job record '" + std::string(head.substr(0, sp)) +
                           "' has a bad length '" + std::string(n) + "'");
    }
    if (text_.size() < nl + 1 + len + 1) return false;
    if (text_[nl + 1 + len] != '\n') {
      throw RemoteJobError("job record '" + std::string(head.substr(0, sp)) +
                           "' is not followed by a newline");
    }
    kind = head.substr(0, sp);
    value = text_.substr(nl + 1, len);
    text_.remove_prefix(nl + 1 + len + 1);
    return true;
  }

  std::string_view rest() const { return text_; }

 private:
  std::string_view text_;
};

// Decodes one job from the front of `text`; returns the bytes it used, or
// 0 when `text` holds only part of a job.
size_t decode_one(std::string_view text, RemoteJob& job) {
  if (text.size() < kMagic.size()) {
    if (kMagic.substr(0, text.size()) != text) {
      throw RemoteJobError("not a dlaunch job (it must start with '" +
                           std::string(kMagic.substr(0, 13)) +
                           "'): is --remote-dlaunch the same version?");
    }
    return 0;
  }
  if (!text.starts_with(kMagic)) {
    throw RemoteJobError(
        "not a dlaunch job of this version (it must start with '" +
        std::string(kMagic.substr(0, 13)) +
        "'): is the head's dlaunch the same version?");
  }
  Reader r(text.substr(kMagic.size()));
  job = RemoteJob{};
  std::string_view kind, value;
  while (r.next(kind, value)) {
    if (kind == "end") return text.size() - r.rest().size();
    if (kind == "arg") {
      job.args.emplace_back(value);
    } else if (kind == "env") {
      size_t eq = value.find('=');
      if (eq == std::string_view::npos || eq == 0) {
        throw RemoteJobError("job env record is not NAME=VALUE");
      }
      job.env[std::string(value.substr(0, eq))] = value.substr(eq + 1);
    } else if (kind == "chdir") {
      job.chdir = value;
    } else if (kind == "host") {
      job.host = value;
    } else if (kind == "tag") {
      job.job_tag = value;
    } else if (kind == "whole-job") {
      job.whole_job = value;
    } else {
      throw RemoteJobError("job record kind '" + std::string(kind) +
                           "' is unknown: is the head's dlaunch the same "
                           "version?");
    }
  }
  return 0;
}

}  // namespace

std::string encode_remote_job(const RemoteJob& job) {
  std::string out(kMagic);
  record(out, "host", job.host);
  record(out, "tag", job.job_tag);
  record(out, "chdir", job.chdir);
  if (!job.whole_job.empty()) record(out, "whole-job", job.whole_job);
  for (const std::string& a : job.args) record(out, "arg", a);
  for (const auto& [k, v] : job.env) record(out, "env", k + "=" + v);
  record(out, "end", "");
  return out;
}

std::string encode_remote_jobs(const std::vector<RemoteJob>& jobs) {
  std::string out;
  const std::string* last = nullptr;
  for (const RemoteJob& j : jobs) {
    if (last != nullptr && *last == j.whole_job) {
      RemoteJob same = j;
      same.whole_job.clear();
      out += encode_remote_job(same);
    } else {
      out += encode_remote_job(j);
    }
    last = &j.whole_job;
  }
  return out;
}

std::vector<RemoteJob> decode_remote_jobs(std::string_view text) {
  std::vector<RemoteJob> jobs;
  while (!text.empty()) {
    RemoteJob job;
    size_t used = decode_one(text, job);
    if (used == 0) throw RemoteJobError("the job text ends in the middle");
    if (job.whole_job.empty() && !jobs.empty()) {
      job.whole_job = jobs.back().whole_job;
    }
    jobs.push_back(std::move(job));
    text.remove_prefix(used);
  }
  return jobs;
}

RemoteJob read_remote_job(int fd, std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  std::string text;
  RemoteJob job;
  // One byte at a time would be slow for 200 KB; the job's end record is
  // found in what was read, and nothing past it may be consumed, so read
  // in blocks only as far as the sizes say.
  while (true) {
    if (decode_one(text, job) > 0) return job;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - Clock::now());
    if (left.count() <= 0) {
      throw RemoteJobError("the job did not arrive on stdin within " +
                           std::to_string(timeout.count()) + " ms (" +
                           std::to_string(text.size()) + " bytes came)");
    }
    pollfd p{fd, POLLIN, 0};
    int n = ::poll(&p, 1, static_cast<int>(left.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw RemoteJobError(std::string("poll: ") + std::strerror(errno));
    if (n == 0) continue;
    // How much may be read without passing the end: at least the rest of
    // the current line; a record's bytes once its header is known.
    size_t want = 1;
    {
      size_t start = text.size() >= kMagic.size() ? kMagic.size() : 0;
      if (start > 0) {
        std::string_view rest(text);
        rest.remove_prefix(start);
        // Skip whole records.
        while (true) {
          size_t nl = rest.find('\n');
          if (nl == std::string_view::npos) break;
          size_t sp = rest.substr(0, nl).find(' ');
          size_t len = 0;
          if (sp != std::string_view::npos) {
            std::from_chars(rest.data() + sp + 1, rest.data() + nl, len);
          }
          if (rest.size() < nl + 1 + len + 1) {
            want = nl + 1 + len + 1 - rest.size();
            break;
          }
          rest.remove_prefix(nl + 1 + len + 1);
        }
      }
    }
    char buf[65536];
    ssize_t got = ::read(fd, buf, std::min(want, sizeof buf));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0)
      throw RemoteJobError(std::string("read: ") + std::strerror(errno));
    if (got == 0) {
      throw RemoteJobError("stdin ended after " + std::to_string(text.size()) +
                           " bytes, before the whole job (did the head "
                           "stop?)");
    }
    text.append(buf, static_cast<size_t>(got));
  }
}

}  // namespace dlaunch::launcher
