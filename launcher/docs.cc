#include "launcher/docs.h"

#include <sstream>
#include <vector>

#include "launcher/flags.h"

namespace dlaunch::launcher {
namespace {

// `s` safe in roff text: backslashes shown as such, '-' as a real minus
// (so flags copied from the page work), and a leading '.' or '\'' not read
// as a request.
std::string escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '\\') {
      out += "\\e";
    } else if (c == '-') {
      out += "\\-";
    } else {
      out += c;
    }
  }
  if (!out.empty() && (out[0] == '.' || out[0] == '\'')) out.insert(0, "\\&");
  return out;
}

size_t indent_of(std::string_view line) {
  size_t n = line.find_first_not_of(' ');
  return n == std::string_view::npos ? line.size() : n;
}

std::string_view trimmed(std::string_view line) {
  return line.substr(indent_of(line));
}

std::string joined(const std::vector<std::string_view>& lines) {
  std::string out;
  for (std::string_view l : lines) {
    out += (out.empty() ? "" : " ") + std::string(trimmed(l));
  }
  return out;
}

// An entry's title line: "-m, --module", "--log-dir DIR", "PET_<KEY>".
// Spellings (and a leading variable name) bold, placeholders italic.
std::string entry_title(std::string_view line) {
  std::istringstream words{std::string(trimmed(line))};
  std::string out, word;
  for (bool first = true; words >> word; first = false) {
    const bool comma = word.back() == ',';
    if (comma) word.pop_back();
    const bool name = first || word[0] == '-';
    out += std::string(first ? "" : " ") + (name ? "\\fB" : "\\fI") +
           escape(word) + "\\fR" + (comma ? "," : "");
  }
  return out;
}

// One block (lines between blank lines) of a section other than NAME.
std::string render_block(const std::vector<std::string_view>& block) {
  bool entries =
      block.size() > 1 && indent_of(block[0]) == 4 && indent_of(block[1]) == 8;
  bool prose = true;
  for (std::string_view l : block) {
    const size_t in = indent_of(l);
    entries = entries && (in == 4 || in == 8);
    prose = prose && in == 4 && trimmed(l).find("  ") == std::string::npos;
  }
  prose = prose && block.back().ends_with('.');
  std::string out;
  if (entries) {
    std::vector<std::string_view> body;
    auto flush = [&] {
      if (!body.empty()) out += escape(joined(body)) + "\n";
      body.clear();
    };
    for (std::string_view l : block) {
      if (indent_of(l) == 4) {
        flush();
        out += ".TP\n" + entry_title(l) + "\n";
      } else {
        body.push_back(l);
      }
    }
    flush();
  } else if (prose) {
    out += ".PP\n" + escape(joined(block)) + "\n";
  } else {  // aligned by hand: exit codes, examples, the synopsis
    out += ".PP\n.nf\n";
    for (std::string_view l : block) {
      out += escape(l.substr(std::min<size_t>(4, indent_of(l)))) + "\n";
    }
    out += ".fi\n";
  }
  return out;
}

std::string render_section(std::string_view title,
                           const std::vector<std::string_view>& lines) {
  std::string out = ".SH " + escape(title) + "\n";
  if (title == "NAME") return out + escape(joined(lines)) + "\n";
  std::vector<std::string_view> block;
  for (size_t i = 0; i <= lines.size(); ++i) {
    if (i == lines.size() || trimmed(lines[i]).empty()) {
      if (!block.empty()) out += render_block(block);
      block.clear();
    } else {
      block.push_back(lines[i]);
    }
  }
  return out;
}

}  // namespace

std::string man_page(std::string_view help, std::string_view version) {
  std::string out =
      ".\\\" Generated from `dlaunch --help` (launcher/docs.cc)\n";
  out += ".TH DLAUNCH 1 \"\" \"dlaunch " + escape(version) +
         "\" \"User Commands\"\n";
  // Left-aligned and unhyphenated: flags and variable names stay whole.
  out += ".ad l\n.nh\n";
  std::string_view title;
  std::vector<std::string_view> lines;
  bool in_section = false;
  while (!help.empty()) {
    const size_t nl = help.find('\n');
    std::string_view line = help.substr(0, nl);
    help.remove_prefix(nl == std::string_view::npos ? help.size() : nl + 1);
    if (!line.empty() && line[0] != ' ') {
      if (in_section) out += render_section(title, lines);
      title = line;
      lines.clear();
      in_section = true;
    } else if (in_section) {
      lines.push_back(line);
    }
  }
  if (in_section) out += render_section(title, lines);
  return out;
}

std::string bash_completion() {
  std::string all, value_cases;
  for (const FlagSpec& f : flags()) {
    const std::vector<std::string> names = spellings(f);
    std::string pattern;
    for (const std::string& s : names) {
      all += (all.empty() ? "" : " ") + s;
      pattern += (pattern.empty() ? "" : "|") + s;
    }
    if (f.type == ValueType::kSwitch) continue;
    std::string reply;
    if (!f.choices.empty()) {
      std::string words;
      for (std::string_view c : f.choices) {
        words += (words.empty() ? "" : " ") + std::string(c);
      }
      reply = "COMPREPLY=($(compgen -W '" + words + "' -- \"$cur\"))";
    } else if (f.type == ValueType::kPath) {
      reply = f.placeholder == "DIR" ? "COMPREPLY=($(compgen -d -- \"$cur\"))"
                                     : "COMPREPLY=($(compgen -f -- \"$cur\"))";
    } else if (f.type == ValueType::kCommand) {
      reply = "COMPREPLY=($(compgen -c -f -- \"$cur\"))";
    } else {
      reply = "COMPREPLY=()";  // free-form: nothing to offer
    }
    value_cases += "    " + pattern + ") " + reply + "; return 0 ;;\n";
  }
  return R"(# bash completion for dlaunch; generated from its flag table
# (launcher/docs.cc), like `dlaunch --help` and dlaunch(1).
_dlaunch() {
  local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"
  local i=1 w
  # From PROG on (the first word that is neither a flag nor a flag's value,
  # or after --), the words are the program's: complete them as files.
  while [ "$i" -lt "$COMP_CWORD" ]; do
    w="${COMP_WORDS[i]}"
    case "$w" in
      --) compopt -o default; COMPREPLY=(); return 0 ;;
)" +
         [&] {
           std::string skip;
           for (const FlagSpec& f : flags()) {
             if (f.type == ValueType::kSwitch) continue;
             for (const std::string& s : spellings(f)) {
               skip += (skip.empty() ? "" : "|") + s;
             }
           }
           // A flag and its value ("--flag value", or "--flag = value" as bash
           // splits --flag=value).
           return "      " + skip +
                  ")\n        if [ \"${COMP_WORDS[i+1]}\" = = ]; then i=$((i + "
                  "3)); "
                  "else i=$((i + 2)); fi\n        continue ;;\n";
         }() +
         R"(      -*) ;;
      *) compopt -o default; COMPREPLY=(); return 0 ;;
    esac
    i=$((i + 1))
  done
  case "$prev" in
)" + value_cases +
         R"(  esac
  if [[ "$cur" == -* ]]; then
    COMPREPLY=($(compgen -W ')" +
         all + R"(' -- "$cur"))
    return 0
  fi
  # PROG: a command in PATH or a file.
  compopt -o filenames
  COMPREPLY=($(compgen -c -f -- "$cur"))
}
complete -F _dlaunch dlaunch
)";
}

}  // namespace dlaunch::launcher
