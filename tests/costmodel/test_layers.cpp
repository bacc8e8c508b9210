#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "costmodel/layers.hpp"
#include "profiles/loader.hpp"
#include "profiles/model_spec.hpp"

using namespace loom;
using namespace loom::costmodel;

TEST_CASE("parameter counts match Hugging Face's base models", "[layers]") {
  // BertModel (with pooler) and GPT2Model as Hugging Face counts them.
  CHECK(count_parameters(profiles::load_model("bert-base")).base_model == 109'482'240);
  CHECK(count_parameters(profiles::load_model("bert-large")).base_model == 335'141'888);
  CHECK(count_parameters(profiles::load_model("gpt2")).base_model == 124'439'808);
  // RobertaModel (roberta-base): 124,645,632 parameters.
  CHECK(count_parameters(profiles::load_model("roberta-base")).base_model == 124'645'632);
}

TEST_CASE("parameter counts match the Llama family's published totals", "[layers]") {
  // LlamaForCausalLM, MistralForCausalLM and Qwen2ForCausalLM as transformers counts them:
  // untied heads, no position table, RMSNorm, Qwen2's q, k and v biases.
  // Llama-2-7B: per layer 4 x 4096^2 + 3 x 4096 x 11008 + 2 x 4096 = 202,383,360; x 32 + 2 x
  // 32000 x 4096 (embedding and head) + 4096 (final RMSNorm) = 6,738,415,616.
  CHECK(count_parameters(profiles::load_model("llama2-7b")).total == 6'738'415'616);
  // Llama-2-70B: 8 kv heads (K and V 1024 wide): per layer 8192 x (8192 + 2048) + 8192^2 + 3 x
  // 8192 x 28672 + 2 x 8192 = 855,654,400; x 80 + 2 x 32000 x 8192 + 8192 = 68,976,648,192.
  CHECK(count_parameters(profiles::load_model("llama2-70b")).total == 68'976'648'192);
  CHECK(count_parameters(profiles::load_model("llama3-8b")).total == 8'030'261'248);
  auto from_config = [](const char* text) {
    return count_parameters(profiles::model_from_json(nlohmann::json::parse(text), "config.json"))
        .total;
  };
  // mistralai/Mistral-7B-v0.1 (7,241,732,096), Qwen/Qwen2-7B (7,615,616,512) and Qwen2-0.5B,
  // whose head is tied (494,032,768), from their config.json files' size fields.
  CHECK(from_config(R"({"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
      "max_position_embeddings": 32768, "num_attention_heads": 32, "num_hidden_layers": 32,
      "num_key_value_heads": 8, "sliding_window": 4096, "tie_word_embeddings": false,
      "vocab_size": 32000})") == 7'241'732'096);
  CHECK(from_config(R"({"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
      "max_position_embeddings": 131072, "num_attention_heads": 28, "num_hidden_layers": 28,
      "num_key_value_heads": 4, "tie_word_embeddings": false, "vocab_size": 152064})") ==
        7'615'616'512);
  CHECK(from_config(R"({"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
      "max_position_embeddings": 32768, "num_attention_heads": 14, "num_hidden_layers": 24,
      "num_key_value_heads": 2, "tie_word_embeddings": true, "vocab_size": 151936})") ==
        494'032'768);
}

TEST_CASE("classification head adds the classifier to the base model", "[layers]") {
  profiles::ModelSpec m = profiles::load_model("bert-base");
  REQUIRE(m.num_labels == 2);
  ParameterCounts c = count_parameters(m);
  // BertForSequenceClassification: base model + 768 * 2 + 2.
  CHECK(c.total == 109'482'240 + 768 * 2 + 2);
}

TEST_CASE("model FLOPs follow Korthikanti et al.'s closed form", "[layers][flops]") {
  for (const char* name : {"gpt2", "gpt2-xl", "gpt3-175b"}) {
    profiles::ModelSpec m = profiles::load_model(name);
    for (std::int64_t batch : {1, 8, 1536}) {
      for (std::int64_t s : {128, 1024, 2048}) {
        const double B = static_cast<double>(batch);
        const double S = static_cast<double>(s);
        const double l = static_cast<double>(m.layers);
        const double h = static_cast<double>(m.hidden);
        const double V = static_cast<double>(m.vocab);
        double expected = 72 * B * S * l * h * h * (1 + S / (6 * h) + V / (12 * l * h));
        CHECK(model_flops_per_step(m, batch, s) == Approx(expected).epsilon(1e-12));
        // Full recomputation: Narayanan et al. 2021's 96 B s l h^2 (1 + s/(6h) + V/(16 l h)).
        double full = 96 * B * S * l * h * h * (1 + S / (6 * h) + V / (16 * l * h));
        CHECK(hardware_flops_per_step(m, batch, s, Recompute::kFull) ==
              Approx(full).epsilon(1e-12));
        CHECK(hardware_flops_per_step(m, batch, s, Recompute::kNone) ==
              Approx(expected).epsilon(1e-12));
        // Selective recomputation repeats QK^T and attention over V: 4 b s^2 h per layer.
        CHECK(hardware_flops_per_step(m, batch, s, Recompute::kSelective) ==
              Approx(expected + l * 4 * B * S * S * h).epsilon(1e-12));
      }
    }
  }
}

TEST_CASE("ffn other than 4h counts the actual matrix shapes", "[layers][flops]") {
  profiles::ModelSpec m = profiles::load_model("gpt2");
  m.ffn_hidden = 2 * m.hidden;  // 2h instead of 4h: MLP FLOPs halve
  const double b = 2, s = 256, h = static_cast<double>(m.hidden);
  double per_layer = 2 * b * s * (4 * h * h + 2 * h * 2 * h) + 4 * b * s * s * h;
  CHECK(transformer_layer_forward_flops(m, 2, 256) == Approx(per_layer).epsilon(1e-12));
}

TEST_CASE("activation memory per layer is Korthikanti et al.'s Table 2", "[layers][memory]") {
  // GPT-3 175B layer: h = 12288, a = 96, s = 2048, b = 1, t = 8.
  const double s = 2048, b = 1, h = 12288, a = 96, t = 8;
  const double sbh = s * b * h;
  ActivationShape x{2048, 1, 12288, 96, 4 * 12288, 2};
  using R = Recompute;
  // No parallelism: sbh (34 + 5as/h).
  CHECK(transformer_layer_activation_bytes(x, 1, false, R::kNone) ==
        Approx(sbh * (34 + 5 * a * s / h)).epsilon(1e-12));
  // Tensor parallelism: sbh (10 + 24/t + 5as/(ht)).
  CHECK(transformer_layer_activation_bytes(x, 8, false, R::kNone) ==
        Approx(sbh * (10 + 24 / t + 5 * a * s / (h * t))).epsilon(1e-12));
  // Tensor + sequence parallelism: sbh/t (34 + 5as/h).
  CHECK(transformer_layer_activation_bytes(x, 8, true, R::kNone) ==
        Approx(sbh / t * (34 + 5 * a * s / h)).epsilon(1e-12));
  // Tensor parallelism + selective recomputation: sbh (10 + 24/t).
  CHECK(transformer_layer_activation_bytes(x, 8, false, R::kSelective) ==
        Approx(sbh * (10 + 24 / t)).epsilon(1e-12));
  // Tensor + sequence parallelism + selective recomputation: 34 sbh / t.
  CHECK(transformer_layer_activation_bytes(x, 8, true, R::kSelective) ==
        Approx(34 * sbh / t).epsilon(1e-12));
  // Full recomputation: 2 sbh (the layer input), 2 sbh / t with sequence parallelism.
  CHECK(transformer_layer_activation_bytes(x, 8, false, R::kFull) == Approx(2 * sbh));
  CHECK(transformer_layer_activation_bytes(x, 8, true, R::kFull) == Approx(2 * sbh / t));
  // Section 5: at these sizes selective recomputation keeps 34/(34 + 5as/h), about 30 %, of the
  // tensor + sequence parallel activations (5as/h = 80 for GPT-3).
  CHECK(5 * a * s / h == 80);
  double ratio = transformer_layer_activation_bytes(x, 8, true, R::kSelective) /
                 transformer_layer_activation_bytes(x, 8, true, R::kNone);
  CHECK(ratio == Approx(34 / (34 + 5 * a * s / h)).epsilon(1e-12));
}

TEST_CASE("grouped-query attention and gated MLPs in FLOPs and activations", "[layers][gqa]") {
  const profiles::ModelSpec m = profiles::load_model("llama2-70b");
  // Per token: QKV 8192 x 10240, output 8192^2, MLP 3 x 8192 x 28672; attention 4 s h.
  const double b = 1, s = 4096, h = 8192;
  const double expected = 2 * b * s * (h * 10240 + h * h + 3 * h * 28672) + 4 * b * s * s * h;
  CHECK(transformer_layer_forward_flops(m, 1, 4096) == Approx(expected).epsilon(1e-12));
  // Activations (no recomputation, tp 1, flash): K and V 1/8 as wide, three ffn-wide tensors:
  // e sbh (QKV in) + e sbh (Q) + 2 e sbh / 8 (K, V) + e sbh (output in) + sbh (mask)
  // + e sbh (MLP in) + 3 e sbf + sbh (mask) + 2 e sbh (norms).
  ActivationShape x{4096, 1, 8192, 64, 28672, 2, 8, true};
  const double sbh = s * b * h;
  const double want = 2 * sbh + 2 * sbh + 4 * sbh / 8 + 2 * sbh + sbh + 2 * sbh +
                      3 * 2 * s * b * 28672 + sbh + 4 * sbh;
  CHECK(transformer_layer_activation_bytes(x, 1, false, Recompute::kNone, false) ==
        Approx(want).epsilon(1e-12));
}

TEST_CASE("Llama keeps no dropout masks, and fp8 linear layers keep fp8 inputs", "[layers][fp8]") {
  // Llama 2 70B at s 4096, b 1, tp 4 with sequence parallelism and selective recomputation
  // (flash), as NeMo ran it. In units of sbh/t = 4096 x 8192 / 4 bytes:
  //   bf16, with masks: 2 (QKV in) + 2 + 2 x 2/8 (Q, K, V) + 2 (attention out) + 1 (mask)
  //     + 2 (MLP in) + 3 x 2 x 3.5 (gate, up, FC2 in) + 1 (mask) + 4 (norms) = 35.5
  //   without masks (the Llama family): 33.5
  //   fp8 linear inputs: 1 (QKV in) + 2.5 + 2 + 1 (projection's fp8 copy) + 1 (MLP in)
  //     + (2 x 2 + 1) x 3.5 + 4 = 29
  const profiles::ModelSpec m = profiles::load_model("llama2-70b");
  CHECK_FALSE(model_dropout(m));
  CHECK(model_dropout(profiles::load_model("bert-base")));
  const double unit = 4096.0 * 8192 / 4;
  ActivationShape x{4096, 1, 8192, 64, 28672, 2, 8, true};
  CHECK(transformer_layer_activation_bytes(x, 4, true, Recompute::kSelective, false) ==
        Approx(35.5 * unit).epsilon(1e-12));
  x.dropout = false;
  CHECK(transformer_layer_activation_bytes(x, 4, true, Recompute::kSelective, false) ==
        Approx(33.5 * unit).epsilon(1e-12));
  x.fp8_linear_inputs = true;
  CHECK(transformer_layer_activation_bytes(x, 4, true, Recompute::kSelective, false) ==
        Approx(29 * unit).epsilon(1e-12));
  // A GeLU MLP keeps FC1's output in 16 bits and FC2's input in fp8: (2 + 1) sbf/t where bf16
  // keeps 4; full recomputation keeps only the layer's input, whatever the products' inputs.
  ActivationShape gpt{2048, 1, 12288, 96, 4 * 12288, 2};
  gpt.fp8_linear_inputs = true;
  const double g = 2048.0 * 12288 / 8;  // sbh/t
  CHECK(transformer_layer_activation_bytes(gpt, 8, true, Recompute::kSelective) ==
        Approx((34 - 1 + 1 - 1 - 4) * g).epsilon(1e-12));
  CHECK(transformer_layer_activation_bytes(gpt, 8, true, Recompute::kFull) == Approx(2 * g));
  // The linear weights fp8 training casts: Q (8192^2), K and V (8192 x 1024 each), the output
  // projection (8192^2) and the MLP's three (8192 x 28672).
  CHECK(layer_linear_weight_parameters(m) == 8192LL * 10240 + 8192LL * 8192 + 3LL * 8192 * 28672);
}
