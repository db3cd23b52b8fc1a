// What the API suites need to know about the model they run against: its chat family (from
// config.json's model_type) and whether its weights are trained (--random-weights says they are
// not: models/deepseek-v4-tiny, models/glm5-tiny). Every protocol check runs on every model; a
// check of what a trained model writes (a call it writes itself, thinking it chooses) runs only
// when the weights are trained, and the suite prints it as skipped, with the reason.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';

export function modelProfile(modelDir, args) {
  let type = 'qwen4_exp';  // the embedded default model
  if (modelDir) type = JSON.parse(readFileSync(join(modelDir, 'config.json'), 'utf8')).model_type ?? type;
  const family = type.startsWith('deepseek_v4') ? 'deepseek_v4' : type.startsWith('glm') ? 'glm' : 'qwen';
  const trained = !args.includes('--random-weights');
  return {
    family,
    trained,
    // The opening of a forced call that the server puts in the prompt and returns as text when
    // the model does not complete the call (src/server/assistant_output.cpp tool_call_prefix,
    // less DeepSeek V4's leading "\n\n", which the output drops as the template's separator).
    forcedCallPrefix(name = '') {
      if (family === 'glm') return `<tool_call>${name}`;
      if (family === 'deepseek_v4')
        return `<｜DSML｜tool_calls>\n<｜DSML｜invoke name="${name ? `${name}">\n` : ''}`;
      return `<tool_call>\n{"name": "${name ? `${name}", "arguments": ` : ''}`;
    },
    // Whether the family's template opens a think block by default (the output is reasoning
    // until </think>): GLM 5.3 does; DeepSeek V4 is in chat mode unless asked; Qwen's template
    // leaves it to the model.
    thinksByDefault: family === 'glm',
    // A random model never writes </think> (its head gives the tag no weight): once its prompt
    // opens a think block, all it writes is reasoning.
  };
}
