"""Writes tests/fixtures/qwen4_exp_variant: a second hf-tiny qwen4_exp checkpoint with float64 reference
logits, exercising what the shared fixture does not: PLE on two layers (ple_layer_index 1: other
primes and multipliers), silu GDN output gate, norm_topk_prob false, hc_count 3, attention biases,
two QSA layers. Run on the H200 machine (HF transformers 5.17): OUT=DIR python3 qwen_variant_oracle.py
Same recipe as ../shared/oracle/hf_oracle.py (float32 weights, float64 forward, eager attention)."""
import torch,json,math,os
from transformers.models.qwen4_exp.configuration_qwen4_exp import Qwen4ExpTextConfig as C
from transformers.models.qwen4_exp.modeling_qwen4_exp import Qwen4ExpForCausalLM as M
from safetensors.torch import save_file
d=dict(vocab_size=256,hidden_size=64,num_hidden_layers=5,num_attention_heads=4,num_key_value_heads=2,head_dim=16,hidden_act="silu",rms_norm_eps=1e-6,max_position_embeddings=512,tie_word_embeddings=False,attention_bias=True,rope_parameters=dict(rope_type="default",rope_theta=1e4,partial_rotary_factor=.5,mrope_section=[2,1,1],mrope_interleaved=True),linear_conv_kernel_dim=4,linear_key_head_dim=16,linear_value_head_dim=16,linear_num_key_heads=2,linear_num_value_heads=4,num_experts=8,num_experts_per_tok=2,moe_intermediate_size=32,shared_expert_intermediate_size=32,norm_topk_prob=False,hc_count=3,hc_lowrank=8,ple_layer_ids=[1,2],ple_embed_dim=32,ple_conv_kernel_size=4,ngram_size=3,heads_per_ngram=2,ngram_vocab_size_base=101,make_ngram_vocab_size_divisible_by=8,split_ngram_parts=1,seed=1234,indexer_n_heads=8,indexer_kv_heads=1,indexer_head_dim=16,indexer_budget=8,indexer_compress_ratio=4,output_gate_type="silu",eos_token_id=1,layer_types=["linear_attention"]*3+["qwen_sparse_attention"]*2)
c=C(**d);c._attn_implementation="eager";c._experts_implementation="eager"
torch.manual_seed(3);g=torch.Generator().manual_seed(3);m=M(c)
with torch.no_grad():
 for n,p in m.named_parameters():
  r=torch.randn(p.shape,generator=g,dtype=torch.float64).to(p.dtype)
  p.copy_(r/math.sqrt(p.shape[-1]) if p.ndim>=2 else p+0.1*r)
m=m.double().eval();o=os.environ["OUT"]+"/v";os.makedirs(o)
save_file({k:(v.float() if v.is_floating_point() else v).contiguous() for k,v in m.state_dict().items()},o+"/model.safetensors",metadata={"format":"pt"})
j=json.loads(c.to_json_string());j.pop("_attn_implementation_autoset",None);json.dump(j,open(o+"/config.json","w"),indent=1)
L=100;t=torch.randint(2,256,(L,),generator=torch.Generator().manual_seed(10));t[L//3]=1;ids=t.view(1,-1);S=[55,1,3,1,7,1,32]
with torch.no_grad():
 f=m(input_ids=ids,use_cache=False).logits[0];k=None;p=0;R=[]
 for s in S:
  q=m(input_ids=ids[:,p:p+s],past_key_values=k,use_cache=True);k=q.past_key_values;R.append(q.logits[0]);p+=s
 i=torch.cat(R)
f.float().numpy().astype("<f4").tofile(o+"/full_100.f32");i.float().numpy().astype("<f4").tofile(o+"/inc_100.f32")
json.dump({"cases":[{"tokens":t.tolist(),"incremental_splits":S,"full_logits":"full_100.f32","incremental_logits":"inc_100.f32","hf_incremental_vs_full_maxabs":(i-f).abs().max().item()}]},open(o+"/golden.json","w"))
print("ok",(i-f).abs().max().item(),f.abs().max().item())
