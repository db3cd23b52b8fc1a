#include "server/assistant_output.h"

namespace fs::server {
namespace {

bool forces_call(const ToolChoice& c) {
  return c.mode == ToolChoice::Mode::kRequired || c.mode == ToolChoice::Mode::kFunction;
}

}  // namespace

AssistantOutput::AssistantOutput(AssistantOutputOptions options)
    : options_(std::move(options)), parser_(options_.parser), stops_(options_.stop) {
  if (!options_.forced_prefix.empty()) absorb(parser_.feed(options_.forced_prefix), pending_);
}

std::vector<OutputEvent> AssistantOutput::feed(std::string_view text) {
  std::vector<OutputEvent> out = std::move(pending_);
  pending_.clear();
  if (stopped()) return out;
  if (!options_.parse) {
    emit_text(stops_.push(text), out);
    return out;
  }
  absorb(parser_.feed(text), out);
  return out;
}

std::vector<OutputEvent> AssistantOutput::finish() {
  std::vector<OutputEvent> out = std::move(pending_);
  pending_.clear();
  if (stopped()) return out;
  if (options_.parse) absorb(parser_.finish(), out);
  if (!stopped()) emit_text(stops_.flush(), out);
  return out;
}

void AssistantOutput::emit_text(std::string text, std::vector<OutputEvent>& out) {
  if (text.empty()) return;
  in_reasoning_ = false;
  message_.content += text;
  if (!out.empty() && out.back().kind == OutputEventKind::kText) {
    out.back().text += text;
    return;
  }
  OutputEvent e;
  e.kind = OutputEventKind::kText;
  e.text = std::move(text);
  out.push_back(std::move(e));
}

void AssistantOutput::absorb(std::vector<OutputEvent> in, std::vector<OutputEvent>& out) {
  for (OutputEvent& e : in) {
    if (stopped()) return;
    if (e.kind == OutputEventKind::kText) {
      emit_text(stops_.push(e.text), out);
      continue;
    }
    // Visible text is interrupted here, so what the stop matcher held back cannot become a stop
    // sequence any more: it is plain text, and it comes first.
    emit_text(stops_.flush(), out);
    in_reasoning_ = e.kind == OutputEventKind::kReasoning;
    switch (e.kind) {
      case OutputEventKind::kReasoning:
        message_.reasoning += e.text;
        break;
      case OutputEventKind::kToolCallBegin:
        message_.tool_calls.push_back({e.id, e.name, ""});
        break;
      case OutputEventKind::kToolCallArguments:
        if (e.index >= 0 && static_cast<std::size_t>(e.index) < message_.tool_calls.size())
          message_.tool_calls[static_cast<std::size_t>(e.index)].arguments += e.text;
        break;
      case OutputEventKind::kToolCallEnd:
        if (e.index >= 0 && static_cast<std::size_t>(e.index) < message_.tool_calls.size())
          message_.tool_calls[static_cast<std::size_t>(e.index)].complete = e.complete;
        calls_done_ =
            options_.max_tool_calls > 0 &&
            message_.tool_calls.size() >= static_cast<std::size_t>(options_.max_tool_calls);
        break;
      case OutputEventKind::kText:
        break;
    }
    out.push_back(std::move(e));
  }
}

std::string tool_call_prefix(ChatFamily family, std::string_view name) {
  switch (family) {
    case ChatFamily::kQwen:
      // <tool_call>\n{"name": "NAME", "arguments": {...}}\n</tool_call>
      if (name.empty()) return "<tool_call>\n{\"name\": \"";
      return "<tool_call>\n{\"name\": " + to_json_text(std::string(name)) + ", \"arguments\": ";
    case ChatFamily::kDeepSeek: {
      // <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```
      std::string p =
          "<\xEF\xBD\x9Ctool\xE2\x96\x81"
          "calls\xE2\x96\x81"
          "begin\xEF\xBD\x9C>"
          "<\xEF\xBD\x9Ctool\xE2\x96\x81"
          "call\xE2\x96\x81"
          "begin\xEF\xBD\x9C>function"
          "<\xEF\xBD\x9Ctool\xE2\x96\x81sep\xEF\xBD\x9C>";
      if (!name.empty()) p.append(name).append("\n```json\n");
      return p;
    }
    case ChatFamily::kGlm:
      // <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>
      return "<tool_call>" + std::string(name);
    case ChatFamily::kDeepSeekV4: {
      // \n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="NAME">\n<｜DSML｜parameter ...: the
      // encoding writes a turn's calls after "\n\n", so the next turn renders this prefix again.
      std::string p =
          "\n\n<\xEF\xBD\x9C"
          "DSML\xEF\xBD\x9Ctool_calls>\n<\xEF\xBD\x9C"
          "DSML\xEF\xBD\x9Cinvoke name=\"";
      if (!name.empty()) p.append(name).append("\">\n");
      return p;
    }
  }
  return {};
}

std::string forced_call_feed(ChatFamily family, std::string_view name) {
  std::string feed = tool_call_prefix(family, name);
  if (family == ChatFamily::kGlm && !name.empty()) feed += '\n';
  return feed;
}

OutputPlan plan_output(ChatFamily family, const GenerationRequest& request,
                       std::string_view rendered) {
  OutputPlan plan;
  plan.output.stop = request.stop;
  if (request.kind == ApiKind::kCompletion) {
    plan.output.parse = false;
    return plan;
  }
  plan.output.parser.family = family;
  plan.output.parser.parse_tool_calls = !request.chat.tools.empty();
  plan.output.parser.parse_reasoning = true;
  plan.output.max_tool_calls = request.tool_choice.parallel ? 0 : 1;
  // Qwen: "<think>\nREASONING\n</think>\n\n"; GLM 5.3 and DeepSeek V4: "<think>REASONING</think>";
  // DeepSeek V3's template has no thinking.
  plan.reasoning_close = family == ChatFamily::kQwen       ? "\n</think>\n\n"
                         : family == ChatFamily::kDeepSeek ? ""
                                                           : "</think>";
  // A template that opens the think block itself: the output starts inside it.
  plan.output.parser.starts_in_reasoning = prompt_opens_reasoning(rendered);
  if (forces_call(request.tool_choice) && !request.chat.tools.empty()) {
    const std::string name =
        request.tool_choice.mode == ToolChoice::Mode::kFunction ? request.tool_choice.name : "";
    plan.output.forced_prefix = forced_call_feed(family, name);
    // A prompt that opened a think block (GLM 5.3, DeepSeek V4 thinking) closes it first: the
    // forced call is the turn's visible output.
    plan.prompt_suffix = (plan.output.parser.starts_in_reasoning ? plan.reasoning_close : "") +
                         tool_call_prefix(family, name);
    plan.output.parser.starts_in_reasoning = false;
  }
  return plan;
}

}  // namespace fs::server
