// Fuzz target: loom-profile/1 documents (layers, links, optimizer), then what the cost model
// derives from them (link fits and the calibration's answers).
#include "costmodel/measured_profile.hpp"
#include "fuzz/fuzz_common.hpp"
#include "profiles/json_reader.hpp"
#include "profiles/loader.hpp"
#include "profiles/profile.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  loom::fuzz::expect_input_error_only([&] {
    const auto json = loom::profiles::parse_json_text(loom::fuzz::text_of(data, size), "fuzz");
    const loom::profiles::Profile p = loom::profiles::profile_from_json(json, "fuzz");
    (void)loom::costmodel::fit_links(p.links);
    loom::profiles::ModelSpec model = loom::profiles::load_model("tiny-bert");
    const loom::costmodel::MeasuredProfile calibration(p, model);
    (void)calibration.layer({loom::profiles::LayerKind::kEncoderLayer, 4, 64, 1, "none", 1});
    (void)calibration.optimizer_s_per_parameter(2, false);
    (void)calibration.optimizer_s_per_parameter(2, true);
  });
  return 0;
}
