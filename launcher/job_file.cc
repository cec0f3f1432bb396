#include "launcher/job_file.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <vector>

#include "launcher/flags.h"
#include "launcher/hostfile.h"
#include "launcher/hosts.h"
#include "launcher/read_text.h"

namespace dlaunch::launcher {
namespace {

namespace fs = std::filesystem;

// Keys that are not flags.
constexpr std::string_view kOwnKeys[] = {"program", "args", "env", "hosts"};

// Reads one job file; one instance per load.
class Loader {
 public:
  Loader(const std::string& path, const agent::EnvMap& env,
         const std::string& flag)
      : env_(env), name_(path), flag_(flag) {
    job_.path = fs::absolute(path).lexically_normal();
    dir_ = job_.path.parent_path();
    job_.top = {name_, 1, 1};
  }

  JobFile load() {
    YAML::Node root;
    std::optional<YAML::Mark> second;  // where a second document starts
    std::string text = read_text<JobFileError>(
        name_, flag_, "give the path of a YAML job file");
    // yaml-cpp takes a quote left open on the last line, when a newline
    // ends the file, for a value that runs to the end. A document end
    // marker on the line after the last is an error inside a quoted value
    // and harmless anywhere else.
    if (!text.empty() && text.back() != '\n') text += '\n';
    const int end_line = static_cast<int>(
        std::count(text.begin(), text.end(), '\n'));  // 0-based
    text += "...";
    try {
      root = YAML::Load(text);
      second = second_document(text);
    } catch (const YAML::ParserException& e) {
      if (e.mark.line == end_line && (e.msg == YAML::ErrorMsg::DOC_IN_SCALAR ||
                                      e.msg == YAML::ErrorMsg::EOF_IN_SCALAR)) {
        throw JobFileError(pos(e.mark).text() +
                           ": not valid YAML: a quoted value is still open "
                           "at the end of the file; close its quote");
      }
      throw JobFileError(pos(e.mark).text() + ": not valid YAML: " + e.msg);
    } catch (const JobFileError&) {
      throw;  // second_document()'s, positioned
    } catch (const std::exception& e) {
      // Not a parse error with a position: yaml-cpp's own text, then.
      throw JobFileError(flag_ + ": '" + name_ + "': not valid YAML (" +
                         e.what() + "); give the path of a YAML job file");
    }
    // One document: keys after a '---' or '...' were silently dropped.
    if (second) {
      throw JobFileError(
          pos(*second).text() +
          ": a second YAML document (after a '---' or '...' line): a job "
          "file holds one; remove the marker or split the file");
    }
    if (root.IsNull()) return job_;
    if (!root.IsMap()) {
      fail(root,
           "the file must be a mapping of keys (program: ..., "
           "nproc_per_node: ...), not a " +
               kind(root));
    }
    std::set<std::string> seen;
    for (const auto& kv : root) {
      const YAML::Node& k = kv.first;
      const YAML::Node& v = kv.second;
      if (!k.IsScalar()) fail(k, "a key must be a plain name");
      const std::string key = k.Scalar();
      if (!seen.insert(key).second) {
        fail(k, key + ": appears twice; keep one");
      }
      read_key(key, k, v);
    }
    if (auto it = job_.settings.find("hostfile");
        it != job_.settings.end() && !job_.hosts.empty()) {
      throw JobFileError(it->second.pos.text() +
                         ": hostfile: hosts and hostfile both name the "
                         "hosts; keep one");
    }
    return job_;
  }

 private:
  // Where the first document with content after the first such one starts
  // (an empty one is no document). Parser events only, at most 64
  // documents: yaml-cpp's LoadAll never ends on some inputs (a stray ']'
  // after a comment gives endless empty documents; found by the fuzzer),
  // which are refused as not valid YAML.
  std::optional<YAML::Mark> second_document(const std::string& text) const {
    struct Scan : YAML::EventHandler {
      std::optional<YAML::Mark> content;
      YAML::Mark start;
      void see(const YAML::Mark& m) {
        if (!content) content = m;
      }
      void OnDocumentStart(const YAML::Mark& m) override { start = m; }
      void OnDocumentEnd() override {}
      void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
      void OnAlias(const YAML::Mark& m, YAML::anchor_t) override { see(m); }
      void OnScalar(const YAML::Mark& m, const std::string&, YAML::anchor_t,
                    const std::string&) override {
        see(m);
      }
      void OnSequenceStart(const YAML::Mark& m, const std::string&,
                           YAML::anchor_t, YAML::EmitterStyle::value) override {
        see(m);
      }
      void OnSequenceEnd() override {}
      void OnMapStart(const YAML::Mark& m, const std::string&, YAML::anchor_t,
                      YAML::EmitterStyle::value) override {
        see(m);
      }
      void OnMapEnd() override {}
    };
    std::istringstream in(text);
    YAML::Parser parser(in);
    bool seen = false;
    for (int i = 0; i < 64; ++i) {
      Scan scan;
      if (!parser.HandleNextDocument(scan)) return std::nullopt;
      if (!scan.content) continue;
      if (seen) return scan.content;
      seen = true;
    }
    Scan last;
    parser.HandleNextDocument(last);
    throw JobFileError(pos(last.start).text() +
                       ": not valid YAML: the parser makes no progress here "
                       "(a stray ']' or '}'?)");
  }

  FilePos pos(const YAML::Mark& m) const {
    if (m.is_null()) return job_.top;
    return {name_, m.line + 1, m.column + 1};
  }

  [[noreturn]] void fail(const YAML::Node& at, const std::string& what) {
    throw JobFileError(pos(at.Mark()).text() + ": " + what);
  }

  static std::string kind(const YAML::Node& n) {
    if (n.IsSequence()) return "list";
    if (n.IsMap()) return "mapping";
    if (n.IsNull()) return "nothing";
    // A file that is no job file at all is one long scalar: quote its
    // start, not all of it.
    const std::string& s = n.Scalar();
    return "'" + (s.size() > 60 ? s.substr(0, 60) + "...'" : s + "'");
  }

  // `${VAR}`, `${VAR:-default}`, `$${` for a literal `${`; `${local_rank}`
  // stays for the worker (torchrun's placeholder in args).
  std::string expand(const YAML::Node& at, const std::string& key,
                     const std::string& s) {
    std::string out;
    for (size_t i = 0; i < s.size();) {
      if (s.compare(i, 3, "$${") == 0) {
        out += "${";
        i += 3;
        continue;
      }
      if (s.compare(i, 2, "${") != 0) {
        out += s[i++];
        continue;
      }
      size_t end = s.find('}', i);
      if (end == std::string::npos) {
        fail(at, key + ": '" + s.substr(i) +
                     "' has no closing '}'; write ${VAR}, ${VAR:-default} "
                     "or $${ for a literal ${");
      }
      std::string inner = s.substr(i + 2, end - i - 2);
      std::optional<std::string> fallback;
      if (size_t d = inner.find(":-"); d != std::string::npos) {
        fallback = inner.substr(d + 2);
        inner = inner.substr(0, d);
      }
      if (!is_variable_name(inner)) {
        fail(at, key + ": '${" + inner +
                     "}' is not a variable name; use letters, digits and _");
      }
      if (inner == "local_rank" && !fallback) {
        out += "${local_rank}";
      } else if (auto it = env_.find(inner); it != env_.end()) {
        out += it->second;
      } else if (fallback) {
        out += *fallback;
      } else {
        fail(at, key + ": ${" + inner +
                     "} is not set in the environment; set it or write ${" +
                     inner + ":-DEFAULT}");
      }
      i = end + 1;
    }
    return out;
  }

  std::string scalar(const YAML::Node& v, const std::string& key,
                     const std::string& want) {
    if (!v.IsScalar()) {
      fail(v, key + ": expected " + want + ", got " + kind(v));
    }
    return expand(v, key, v.Scalar());
  }

  // `p` against the file's folder when relative.
  std::string resolve(const std::string& p) const {
    if (p.empty() || fs::path(p).is_absolute()) return p;
    return (dir_ / p).lexically_normal().string();
  }

  void read_key(const std::string& key, const YAML::Node& k,
                const YAML::Node& v) {
    if (key == "program") {
      std::string p = scalar(v, key, "a program name or path");
      if (p.empty()) fail(v, "program: must not be empty");
      job_.program = FileSetting{
          p.find('/') == std::string::npos ? p : resolve(p), pos(v.Mark())};
    } else if (key == "args") {
      if (v.IsNull()) {
        job_.args.emplace();
        return;
      }
      if (!v.IsSequence()) {
        fail(v, "args: expected a list like [--epochs, \"3\"], got " + kind(v));
      }
      std::vector<std::string> args;
      for (const auto& a : v) args.push_back(scalar(a, key, "a string"));
      job_.args = std::move(args);
    } else if (key == "env") {
      if (v.IsNull()) return;
      if (!v.IsMap()) {
        fail(v, "env: expected a mapping like {NAME: value}, got " + kind(v));
      }
      std::map<std::string, int> seen;  // name: its first line
      for (const auto& e : v) {
        std::string name = scalar(e.first, "env", "a variable name");
        if (!is_variable_name(name)) {
          fail(e.first, "env: '" + name +
                            "' is not a variable name; use letters, digits "
                            "and _, not starting with a digit (like "
                            "MY_VAR_1)");
        }
        // As a key given twice at the top: which value wins is not
        // obvious, so neither does.
        if (auto [it, fresh] = seen.emplace(name, pos(e.first.Mark()).line);
            !fresh) {
          fail(e.first, "env: " + name + " appears twice (first on line " +
                            std::to_string(it->second) + "); keep one");
        }
        job_.env[name] = scalar(e.second, "env." + name, "a string");
      }
    } else if (key == "hosts") {
      read_hosts(v);
    } else if (const FlagSpec* f = find_flag(key);
               f && !f->action && f->key == key) {
      // An empty list of repeated items adds none (export: []).
      if (f->type == ValueType::kRepeated && v.IsSequence() && v.size() == 0) {
        return;
      }
      job_.settings[std::string(f->name)] =
          FileSetting{flag_value(*f, key, v), pos(v.Mark())};
    } else {
      unknown(key, k);
    }
  }

  // A --rdzv-conf value: a file's path (token_file, cacert, ...) is the
  // job file's folder's, as log_dir is.
  std::string map_value(const std::string& name,
                        const std::string& value) const {
    return is_rdzv_conf_path(name) ? resolve(value) : value;
  }

  // The node as its flag's command-line text, after a type check.
  std::string flag_value(const FlagSpec& f, const std::string& key,
                         const YAML::Node& v) {
    using T = ValueType;
    if ((f.type == T::kList || f.type == T::kRepeated) && v.IsSequence()) {
      const char* sep = f.type == T::kList ? "," : "\n";
      std::string out;
      for (const auto& item : v) {
        out += (out.empty() ? "" : sep) + scalar(item, key, "a list item");
      }
      return out;
    }
    if (f.type == T::kMap && v.IsMap()) {
      std::string out;
      std::set<std::string> names;
      for (const auto& e : v) {
        const std::string name = scalar(e.first, key, "a name");
        if (!names.insert(name).second) {
          fail(e.first, key + "." + name + ": appears twice; keep one");
        }
        out += (out.empty() ? "" : ",") + name + "=" +
               map_value(name, scalar(e.second, key, "a value"));
      }
      return out;
    }
    std::string want;
    switch (f.type) {
      case T::kSwitch:
        want = "true or false";
        break;
      case T::kInt:
        want = "an integer";
        break;
      case T::kSeconds:
        want = "a number of seconds";
        break;
      case T::kList:
      case T::kRepeated:
        want = "a list";
        break;
      case T::kMap:
        want = "a mapping";
        break;
      default:
        want = "a string";
    }
    for (std::string_view c : f.choices) {
      want += ", " + std::string(c);
    }
    if (!v.IsScalar()) fail(v, key + ": expected " + want + ", got " + kind(v));
    std::string s = expand(v, key, v.Scalar());
    bool ok = true;
    if (f.type == T::kSwitch) {
      try {
        parse_switch(s);
      } catch (const BadValue&) {
        ok = false;
      }
    } else if (f.type == T::kInt) {
      long long n = 0;
      ok = parse_number(s, n) ||
           std::find(f.choices.begin(), f.choices.end(), s) != f.choices.end();
    } else if (f.type == T::kSeconds) {
      // YAML spells them .inf and .nan: the flag's check then says why
      // they are refused.
      if (s == ".inf" || s == ".nan" || s == "-.inf") s.erase(s.find('.'), 1);
      double d = 0;
      ok = parse_number(s, d);
    } else if (f.type == T::kPath) {
      s = resolve(s);
    } else if (f.type == T::kCommand && s.find('/') != std::string::npos) {
      s = resolve(s);
    } else if (f.type == T::kMap) {
      // K=V,... written as one string.
      std::string out;
      for (size_t start = 0; start <= s.size();) {
        size_t end = std::min(s.find(',', start), s.size());
        std::string kv = s.substr(start, end - start);
        if (size_t eq = kv.find('='); eq != std::string::npos) {
          kv = kv.substr(0, eq + 1) +
               map_value(kv.substr(0, eq), kv.substr(eq + 1));
        }
        out += (start == 0 ? "" : ",") + kv;
        start = end + 1;
      }
      s = out;
    }
    if (!ok) fail(v, key + ": expected " + want + ", got '" + s + "'");
    return s;
  }

  // Whether `hosts: TEXT` means a file: a path ('/') or a hostfile's
  // name (hosts.txt, a.hosts, b.cfg, myhostfile).
  static bool looks_like_a_file(const std::string& text) {
    std::string lower = text;
    for (char& c : lower) c = static_cast<char>(std::tolower(c));
    // The names hostfiles go by: "hosts" and "nodes" whole ("gpu-nodes"
    // may well be a host), MPI's machinefile and the like also at the end
    // of a name (no host name ends in "file"), and file suffixes.
    if (lower == "hosts" || lower == "nodes") return true;
    for (const char* name : {"hostfile", "machinefile", "nodefile"}) {
      if (lower.ends_with(name)) return true;
    }
    return text.find('/') != std::string::npos || lower.ends_with(".txt") ||
           lower.ends_with(".hosts") || lower.ends_with(".cfg");
  }

  void read_hosts(const YAML::Node& v) {
    if (v.IsNull()) return;
    if (v.IsScalar()) {
      // A hostlist (node[01-04]:8,gpu7), or a hostfile's path.
      std::string text = scalar(v, "hosts", "a hostlist or hostfile path");
      std::string file = resolve(text);
      const bool one = text.find_first_of("[,") == std::string::npos;
      // (A name too long for a path is no file: exists() threw on it.)
      std::error_code ec;
      const bool there = one && fs::exists(file, ec);
      // A name no host has: a hostfile that is missing, not a host.
      if (one && !there && looks_like_a_file(text)) {
        fail(v, "hosts: '" + file +
                    "': no such file; give the path of a hostfile (relative "
                    "to this file's folder) or a hostlist like node[01-04]");
      }
      try {
        if (there) {
          job_.hosts = read_hostfile(file);
        } else {
          job_.hosts = parse_host_list(text);
        }
      } catch (const HostsError& e) {
        if (std::string(e.what()).starts_with(file + ":"))
          throw JobFileError(e.what());
        fail(v, std::string("hosts: ") + e.what());
      }
      return;
    }
    if (!v.IsSequence()) {
      fail(v,
           "hosts: expected a list like [node1, node2:4] or a hostfile "
           "path, got " +
               kind(v));
    }
    std::set<std::string> names;
    for (const auto& h : v) {
      std::string s = scalar(h, "hosts", "NAME or NAME:SLOTS");
      std::vector<Host> some;
      try {
        some = parse_host_list(s);
      } catch (const HostsError& e) {
        fail(h, std::string("hosts: ") + e.what());
      }
      for (Host& one : some) {
        if (!names.insert(one.name).second) {
          fail(h, "hosts: '" + one.name +
                      "' is listed twice; give "
                      "SLOTS instead (" +
                      one.name + ":4)");
        }
        job_.hosts.push_back(std::move(one));
      }
    }
  }

  [[noreturn]] void unknown(const std::string& key, const YAML::Node& k) {
    std::vector<std::string> valid(std::begin(kOwnKeys), std::end(kOwnKeys));
    for (const FlagSpec& f : flags()) {
      std::string under(f.name);
      std::replace(under.begin(), under.end(), '-', '_');
      if (f.action && (key == f.name || key == under)) {
        fail(k, "'" + key + "' is a command-line action (--" +
                    std::string(f.name) + "), not a job key");
      }
      if (!f.action) valid.emplace_back(f.key);
    }
    std::string best;
    size_t best_d = std::string::npos;
    for (const std::string& v : valid) {
      size_t d = distance(key, v);
      if (d < best_d) {
        best_d = d;
        best = v;
      }
    }
    std::string hint =
        best_d <= std::max<size_t>(2, key.size() / 3)
            ? "; did you mean " + best + "?"
            : "; valid keys are the flags' names with '_' (nproc_per_node) "
              "and program, args, env, hosts";
    fail(k, "unknown key '" + key + "'" + hint);
  }

  // Edit distance, with '-' and '_' counted equal.
  static size_t distance(const std::string& a, const std::string& b) {
    auto same = [](char x, char y) {
      if (x == '-') x = '_';
      if (y == '-') y = '_';
      return std::tolower(x) == std::tolower(y);
    };
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      size_t diag = row[0];
      row[0] = i;
      for (size_t j = 1; j <= b.size(); ++j) {
        size_t up = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1,
                           diag + (same(a[i - 1], b[j - 1]) ? 0 : 1)});
        diag = up;
      }
    }
    return row[b.size()];
  }

  const agent::EnvMap& env_;
  std::string name_;
  std::string flag_;  // the flag that named the file (--config, --drill)
  fs::path dir_;
  JobFile job_;
};

}  // namespace

std::string FilePos::text() const {
  return file + ":" + std::to_string(line) + ":" + std::to_string(column);
}

JobFile load_job_file(const std::string& path, const agent::EnvMap& env,
                      const std::string& flag) {
  return Loader(path, env, flag).load();
}

bool is_secret_name(const std::string& name) {
  // By words between '_': TOKENIZERS_PARALLELISM, MAX_TOKENS and AUTHOR
  // are settings (printed as ${NAME} they broke a printed job's rerun);
  // HF_TOKEN, PGPASSWORD, NPM_CONFIG__AUTHTOKEN, WANDB_API_KEY are not.
  std::string up;
  for (char c : name) up += static_cast<char>(std::toupper(c));
  if (up == "SSH_AUTH_SOCK") return false;  // a socket's path
  std::vector<std::string> words(1);
  for (char c : up) {
    if (c == '_') {
      words.emplace_back();
    } else {
      words.back() += c;
    }
  }
  for (size_t i = 0; i < words.size(); ++i) {
    const std::string& w = words[i];
    // Inside a word: PGPASSWORD, DJANGO_SECRETKEY, APITOKEN.
    for (const char* part : {"PASSWORD", "PASSWD", "SECRET", "CREDENTIAL"}) {
      if (w.find(part) != std::string::npos) return true;
    }
    if (w.ends_with("TOKEN") || w == "APIKEY" || w == "AUTH" || w == "PASS" ||
        w == "PAT" || (w == "PWD" && words.size() > 1)) {
      return true;
    }
    if (i + 1 < words.size() && words[i + 1] == "KEY" &&
        (w == "API" || w == "ACCESS" || w == "PRIVATE" || w == "SECRET")) {
      return true;
    }
  }
  return false;
}

}  // namespace dlaunch::launcher
