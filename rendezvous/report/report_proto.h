// A failure report (report.h) on the wire: crun.v1.FailureReport (proto/crun/v1/rendezvous.proto),
// both ways, kept with the model's other encodings so that a report field is edited here and
// where it is measured. The service's messages (rendezvous/service/proto_messages.h) and the
// agent's session (agent/rendezvous/session_wire.h) send it through these. Its own library,
// crun_report_proto: crun_report itself stays free of protobuf.
#pragma once

#include "crun/v1/rendezvous.pb.h"
#include "rendezvous/report/report.h"

namespace crun::report {

void ToProto(const FailureReport& r, v1::FailureReport* out);
FailureReport FromProto(const v1::FailureReport& r);

}  // namespace crun::report
