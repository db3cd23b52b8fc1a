// The engine worker with the embedded model: what only a real generation shows (a reasoning
// budget closes the think block and the turn goes on).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/loader.h"
#include "server/engine.h"

namespace fs::server {
namespace {

struct Turn {
  ParsedOutput message;
  JobSummary summary;
  std::vector<OutputEvent> events;
};

Turn run_job(Engine& engine, std::shared_ptr<Job> job) {
  Turn t;
  EXPECT_TRUE(engine.submit(job));
  for (;;) {
    auto e = job->next(std::chrono::milliseconds(30000));
    if (!e) {
      ADD_FAILURE() << "no event within 30 s";
      return t;
    }
    for (auto& ev : e->output) t.events.push_back(std::move(ev));
    if (e->done()) {
      t.message = std::move(e->message);
      t.summary = e->summary;
      return t;
    }
  }
}

class ServerEngine : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = load_tokenizer_dir(EMBEDDED_MODEL_DIR);
    ASSERT_TRUE(tok.ok()) << tok.status().to_string();
    tokenizer_ = std::make_unique<TokenizerBundle>(std::move(*tok));
  }

  std::unique_ptr<Engine> engine(int mtp_depth, std::string prompt_log = {}) {
    auto model = load_model(EMBEDDED_MODEL_DIR);
    EXPECT_TRUE(model.ok()) << model.status().to_string();
    EngineOptions eo;
    eo.mtp_depth = mtp_depth;
    eo.prompt_log = std::move(prompt_log);
    auto e = Engine::create(eo, std::move(*model), *tokenizer_, metrics_);
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    return std::move(*e);
  }

  // A turn whose output starts inside a think block (as after a template that opens it).
  std::shared_ptr<Job> thinking_job(std::optional<std::int64_t> budget) {
    auto job = std::make_shared<Job>();
    auto ids = tokenizer_->tokenizer.encode(
        "<|im_start|>user\nwrite a parser<|im_end|>\n<|im_start|>assistant\n<think>\n");
    EXPECT_TRUE(ids.ok());
    job->prompt = std::move(*ids);
    job->max_tokens = 48;
    job->output.parser.family = ChatFamily::kQwen;
    job->output.parser.starts_in_reasoning = true;
    job->output.parser.parse_tool_calls = false;
    job->reasoning_budget = budget;
    job->reasoning_close = "\n</think>\n\n";
    return job;
  }

  std::unique_ptr<TokenizerBundle> tokenizer_;
  Metrics metrics_;
};

TEST_F(ServerEngine, ReasoningBudgetClosesTheThinkBlockAndTheTurnGoesOn) {
  for (const int depth : {0, 2}) {
    auto e = engine(depth);
    // Unbounded, the embedded model reasons for several tokens (then answers or not).
    const Turn free = run_job(*e, thinking_job(std::nullopt));
    ASSERT_FALSE(free.message.reasoning.empty()) << "depth " << depth;
    const Turn bounded = run_job(*e, thinking_job(3));
    // The same greedy reasoning, cut after 3 tokens; then the answer, in the rest of max_tokens
    // less the closing text's tokens.
    ASSERT_FALSE(bounded.message.reasoning.empty());
    EXPECT_LT(bounded.message.reasoning.size(), free.message.reasoning.size());
    EXPECT_EQ(free.message.reasoning.rfind(bounded.message.reasoning, 0), 0u)
        << bounded.message.reasoning << " | " << free.message.reasoning;
    EXPECT_FALSE(bounded.message.content.empty()) << "depth " << depth;
    const auto close = tokenizer_->tokenizer.encode("\n</think>\n\n");
    ASSERT_TRUE(close.ok());
    EXPECT_LE(bounded.summary.completion_tokens, 48 - static_cast<std::int64_t>(close->size()));
    EXPECT_TRUE(bounded.summary.finish_reason == "length" ||
                bounded.summary.finish_reason == "stop");
    // Reasoning events all come before the text.
    bool text_seen = false;
    for (const auto& ev : bounded.events) {
      if (ev.kind == OutputEventKind::kText) text_seen = true;
      if (ev.kind == OutputEventKind::kReasoning) {
        EXPECT_FALSE(text_seen);
      }
    }
  }
}

TEST_F(ServerEngine, PromptLogHoldsEachPromptAsTheModelReadsIt) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("flashserve-prompts-" + std::to_string(::getpid()) + ".jsonl");
  std::filesystem::remove(path);
  {
    auto e = engine(0, path.string());
    const std::vector<std::string> prompts = {
        "<|im_start|>user\nfirst \"quoted\" prompt<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>user\nsecond\tone\n\u00e9<|im_end|>\n<|im_start|>assistant\n"};
    for (const auto& p : prompts) {
      auto job = std::make_shared<Job>();
      auto ids = tokenizer_->tokenizer.encode(p);
      ASSERT_TRUE(ids.ok());
      job->prompt = std::move(*ids);
      job->max_tokens = 2;
      run_job(*e, job);
    }
    std::ifstream in(path);
    std::string line;
    std::vector<nlohmann::json> lines;
    while (std::getline(in, line)) lines.push_back(nlohmann::json::parse(line));
    ASSERT_EQ(lines.size(), prompts.size());
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(lines[i]["prompt"].get<std::string>(), prompts[i]);
      EXPECT_EQ(lines[i]["prompt_tokens"].get<std::int64_t>(),
                static_cast<std::int64_t>(tokenizer_->tokenizer.encode(prompts[i])->size()));
    }
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace fs::server
