// Throughput of the chat output parser: output_parser_bench [MIB] [PIECE_BYTES]
// Feeds MIB (default 1) MiB of code-like text in pieces of PIECE_BYTES (default 4, about a
// token) as plain text, as reasoning, and as one tool call's argument in each syntax, and prints
// the best of 5 runs; bench/NOTES.md records the figures with the command.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tokenizer/chat/output_parser.h"

namespace {

double seconds_to_parse(const std::string& text, fs::ChatFamily family, std::size_t piece) {
  double best = 1e30;
  for (int run = 0; run < 5; ++run) {
    const auto t0 = std::chrono::steady_clock::now();
    fs::OutputParserOptions options;
    options.family = family;
    fs::ChatOutputParser parser(options);
    std::size_t events = 0;
    for (std::size_t i = 0; i < text.size(); i += piece) {
      events += parser.feed(std::string_view(text).substr(i, piece)).size();
    }
    events += parser.finish().size();
    const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
    if (events == 0) std::abort();  // keeps the work observable
    best = std::min(best, dt.count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const double mib = argc > 1 ? std::atof(argv[1]) : 1.0;
  const std::size_t piece = argc > 2 ? std::strtoul(argv[2], nullptr, 10) : 4;
  if (mib <= 0 || piece == 0) {
    std::fprintf(stderr, "usage: output_parser_bench [MIB] [PIECE_BYTES]\n");
    return 2;
  }
  // Code with the characters the parser looks at: '<', quotes, backslashes, newlines.
  std::string body;
  while (body.size() < mib * (1 << 20)) {
    body += "if (a < b && s == \"x\\n\") { return <tool; } // é\n";
  }
  std::string escaped;  // the same as a JSON string's content
  for (const char c : body) {
    if (c == '\n') {
      escaped += "\\n";
      continue;
    }
    if (c == '"' || c == '\\') escaped += '\\';
    escaped += c;
  }
  struct Case {
    const char* name;
    fs::ChatFamily family;
    std::string text;
  };
  const Case cases[] = {
      {"text", fs::ChatFamily::kQwen, body},
      {"reasoning", fs::ChatFamily::kQwen, "<think>\n" + body + "\n</think>\n\nok"},
      {"qwen json", fs::ChatFamily::kQwen,
       "<tool_call>\n{\"name\": \"w\", \"arguments\": {\"c\": \"" + escaped + "\"}}\n</tool_call>"},
      {"qwen xml", fs::ChatFamily::kQwen,
       "<tool_call>\n<function=w>\n<parameter=c>\n" + body +
           "\n</parameter>\n</function>\n</tool_call>"},
      {"deepseek v3.1", fs::ChatFamily::kDeepSeek,
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>w<｜tool▁sep｜>{\"c\": \"" + escaped +
           "\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"},
      {"deepseek dsml", fs::ChatFamily::kDeepSeek,
       "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"w\">\n<｜DSML｜parameter name=\"c\" "
       "string=\"true\">" +
           body + "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>"},
      {"glm", fs::ChatFamily::kGlm,
       "<tool_call>w\n<arg_key>c</arg_key>\n<arg_value>" + body + "</arg_value>\n</tool_call>"},
  };
  std::printf("%-14s %10s %9s %9s\n", "output", "bytes", "ms", "MB/s");
  for (const Case& c : cases) {
    const double s = seconds_to_parse(c.text, c.family, piece);
    std::printf("%-14s %10zu %9.1f %9.1f\n", c.name, c.text.size(), s * 1e3,
                c.text.size() / s / 1e6);
  }
  return 0;
}
