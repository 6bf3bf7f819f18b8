// `mc2 trace plot`: a trace drawn as an SVG timeline.
//
// One lane per rank and category (compute and communication always, wait
// and host when the rank has such spans), spans coloured by operator name,
// communication that no compute hides hatched and outlined in red, step
// markers as dashed lines, a time axis with units and a legend. Adjacent
// spans of one name closer than a pixel are drawn as one rectangle (its
// tooltip says how many), so the file stays small for long traces.
#ifndef MC2_TRACE_TOOLS_TIMELINE_SVG_H_
#define MC2_TRACE_TOOLS_TIMELINE_SVG_H_

#include <cstdint>
#include <optional>
#include <string>

#include "mc2/trace_file.h"

namespace mc2::trace {

struct PlotOptions {
  int width = 1400;                // pixels
  std::optional<int64_t> step;     // draw only this step's window
  std::optional<int64_t> from_ns;  // window start, relative to the trace start
  std::optional<int64_t> to_ns;    // window end, relative to the trace start
  std::string title;               // default: "mc2 timeline"
};

// The SVG document. Throws mc2::Error(kInvalidArgument) if the step is not
// in the trace or the window is empty.
std::string RenderTimelineSvg(const TraceData& t, const PlotOptions& options = {});

}  // namespace mc2::trace

#endif  // MC2_TRACE_TOOLS_TIMELINE_SVG_H_
