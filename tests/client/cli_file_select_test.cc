// The CLI's tensor selection, shared-scale groups and hf_quant_config.json (file_select.h),
// without a server. The end-to-end behaviour is in cli_select_test.cc and
// cli_checkpoint_test.py.
#include "file_select.h"

#include <string>

#include "fp4q/common/json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace fp4q::client::cli {
namespace {

using ::fp4q::testing::IsOk;
using ::fp4q::testing::StatusIs;
using ::testing::HasSubstr;

TEST(FileSelectTest, ModuleOfStripsOneWeightSuffix) {
  EXPECT_EQ(ModuleOf("model.layers.0.mlp.down_proj.weight"), "model.layers.0.mlp.down_proj");
  EXPECT_EQ(ModuleOf("lm_head.weight"), "lm_head");
  EXPECT_EQ(ModuleOf("c00.x"), "c00.x");
  EXPECT_EQ(ModuleOf(".weight"), ".weight");
  EXPECT_EQ(ModuleOf("weight"), "weight");
  EXPECT_EQ(ModuleOf("a.bias"), "a.bias");
}

TEST(FileSelectTest, DefaultExclusionsRecogniseEmbeddingsNormsAndTheLmHead) {
  EXPECT_EQ(DefaultExclusion("model.embed_tokens.weight"),
            "embedding (name part \"embed_tokens\")");
  EXPECT_EQ(DefaultExclusion("bert.embeddings.word_embeddings.weight"),
            "embedding (name part \"embeddings\")");
  EXPECT_EQ(DefaultExclusion("transformer.wte.weight"), "embedding (name part \"wte\")");
  EXPECT_EQ(DefaultExclusion("transformer.wpe.weight"), "embedding (name part \"wpe\")");
  EXPECT_EQ(DefaultExclusion("model.layers.3.post_attention_layernorm.weight"),
            "norm (name part \"post_attention_layernorm\")");
  EXPECT_EQ(DefaultExclusion("model.norm.weight"), "norm (name part \"norm\")");
  EXPECT_EQ(DefaultExclusion("transformer.h.0.ln_1.weight"), "norm (name part \"ln_1\")");
  EXPECT_EQ(DefaultExclusion("transformer.ln_f.weight"), "norm (name part \"ln_f\")");
  EXPECT_EQ(DefaultExclusion("encoder.LayerNorm.weight"), "norm (name part \"LayerNorm\")");
  EXPECT_EQ(DefaultExclusion("lm_head.weight"), "LM head (name part \"lm_head\")");
  // Linear layers are candidates; "weight" is not a module part.
  EXPECT_EQ(DefaultExclusion("model.layers.0.self_attn.q_proj.weight"), "");
  EXPECT_EQ(DefaultExclusion("model.layers.0.mlp.down_proj.weight"), "");
  EXPECT_EQ(DefaultExclusion("transformer.h.0.mlp.c_fc.weight"), "");
  EXPECT_EQ(DefaultExclusion("blk.lnx.weight"), "");  // "ln" only as a whole part or ln_*
}

TEST(FileSelectTest, IncludeExcludeAndDefaultsInOrder) {
  SelectOptions o;
  EXPECT_EQ(ExclusionReason(o, "model.layers.0.mlp.up_proj.weight"), "");
  EXPECT_EQ(ExclusionReason(o, "model.embed_tokens.weight"),
            "default exclusion: embedding (name part \"embed_tokens\")");
  o.exclude = {"*.mlp.*", "*o_proj*"};
  EXPECT_EQ(ExclusionReason(o, "model.layers.0.mlp.up_proj.weight"), "--exclude '*.mlp.*'");
  EXPECT_EQ(ExclusionReason(o, "model.layers.0.self_attn.o_proj.weight"),
            "--exclude '*o_proj*'");
  EXPECT_EQ(ExclusionReason(o, "model.layers.0.self_attn.q_proj.weight"), "");
  o.include = {"model.layers.1[0-9].*", "lm_head.weight"};
  EXPECT_EQ(ExclusionReason(o, "model.layers.0.self_attn.q_proj.weight"),
            "not matched by --include");
  EXPECT_EQ(ExclusionReason(o, "model.layers.12.self_attn.q_proj.weight"), "");
  EXPECT_EQ(ExclusionReason(o, "lm_head.weight"),
            "default exclusion: LM head (name part \"lm_head\")");
  o.default_excludes = false;
  EXPECT_EQ(ExclusionReason(o, "lm_head.weight"), "");
}

TEST(FileSelectTest, SharedScaleGroupsAreTheFusedSiblings) {
  EXPECT_EQ(ScaleGroupOf("model.layers.0.self_attn.q_proj.weight"),
            "model.layers.0.self_attn.{q,k,v}_proj.weight");
  EXPECT_EQ(ScaleGroupOf("model.layers.0.self_attn.v_proj.weight"),
            "model.layers.0.self_attn.{q,k,v}_proj.weight");
  EXPECT_EQ(ScaleGroupOf("model.layers.0.mlp.up_proj.weight"),
            "model.layers.0.mlp.{gate,up}_proj.weight");
  EXPECT_EQ(ScaleGroupOf("model.layers.0.block_sparse_moe.experts.3.w3.weight"),
            "model.layers.0.block_sparse_moe.experts.3.{w1,w3}.weight");
  EXPECT_EQ(ScaleGroupOf("q_proj.weight"), "{q,k,v}_proj.weight");
  EXPECT_EQ(ScaleGroupOf("model.layers.0.self_attn.o_proj.weight"), "");
  EXPECT_EQ(ScaleGroupOf("model.layers.0.mlp.down_proj.weight"), "");
  EXPECT_EQ(ScaleGroupOf("model.layers.0.block_sparse_moe.experts.3.w2.weight"), "");
  EXPECT_EQ(ScaleGroupOf("model.layers.0.self_attn.q_proj"), "");  // not "<module>.weight"
}

TEST(FileSelectTest, HfQuantConfigIsModelOptsLayout) {
  HfQuantConfig c;
  c.exclude_modules = {"model.embed_tokens", "lm_head"};
  absl::StatusOr<std::string> text = HfQuantConfigJson(c, "", "d/hf_quant_config.json");
  ASSERT_THAT(text, IsOk());
  absl::StatusOr<common::JsonValue> doc = common::ParseJson(*text);
  ASSERT_THAT(doc, IsOk());
  EXPECT_EQ(doc->Find("producer")->Find("name")->text(), "fp4q");
  EXPECT_EQ(doc->Find("producer")->Find("version")->text(), "0.1.0");
  EXPECT_EQ(doc->Find("quant_method")->text(), "modelopt_fp4");
  const common::JsonValue* q = doc->Find("quantization");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->Find("quant_algo")->text(), "NVFP4");
  EXPECT_EQ(q->Find("group_size")->text(), "16");
  ASSERT_NE(q->Find("kv_cache_quant_algo"), nullptr);
  EXPECT_TRUE(q->Find("kv_cache_quant_algo")->is_null());
  ASSERT_EQ(q->Find("exclude_modules")->items().size(), 2u);
  EXPECT_EQ(q->Find("exclude_modules")->items()[0].text(), "lm_head");  // sorted
  EXPECT_EQ(q->Find("exclude_modules")->items()[1].text(), "model.embed_tokens");

  // A second shard adds its modules to the same file.
  HfQuantConfig more;
  more.exclude_modules = {"model.layers.9.mlp.odd", "lm_head"};
  absl::StatusOr<std::string> merged = HfQuantConfigJson(more, *text, "d/hf_quant_config.json");
  ASSERT_THAT(merged, IsOk());
  doc = common::ParseJson(*merged);
  ASSERT_THAT(doc, IsOk());
  const auto& items = doc->Find("quantization")->Find("exclude_modules")->items();
  ASSERT_EQ(items.size(), 3u);
  EXPECT_EQ(items[2].text(), "model.layers.9.mlp.odd");
}

TEST(FileSelectTest, ForeignHfQuantConfigIsRefusedNamingWhy) {
  const std::string path = "d/hf_quant_config.json";
  EXPECT_THAT(HfQuantConfigJson({}, "{\"producer\": {\"name\": \"modelopt\"}}", path),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("\"d/hf_quant_config.json\" exists and was not written by fp4q "
                                 "for NVFP4 with group_size 16 (its producer.name is not "
                                 "\"fp4q\"); remove it")));
  EXPECT_THAT(HfQuantConfigJson({}, "not json", path),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("(not JSON: ")));
  EXPECT_THAT(HfQuantConfigJson({}, "{\"producer\": {\"name\": \"fp4q\"}, \"quantization\": "
                                    "{\"quant_algo\": \"FP8\"}}", path),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("its quantization.quant_algo is not \"NVFP4\"")));
  EXPECT_THAT(HfQuantConfigJson({}, "{\"producer\": {\"name\": \"fp4q\"}, \"quantization\": "
                                    "{\"quant_algo\": \"NVFP4\", \"group_size\": 32}}", path),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("its quantization.group_size is not 16")));
}

TEST(FileSelectTest, ConfigPathIsBesideTheOutput) {
  EXPECT_EQ(HfQuantConfigPath("out/model.safetensors"), "out/hf_quant_config.json");
  EXPECT_EQ(HfQuantConfigPath("/a/b/c.safetensors"), "/a/b/hf_quant_config.json");
  EXPECT_EQ(HfQuantConfigPath("model.safetensors"), "hf_quant_config.json");
}

}  // namespace
}  // namespace fp4q::client::cli
