package bus

import (
	"unicode/utf8"
	"unsafe"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/troupe-run/troupe/proto/capv1"
)

// fastDecode decodes a submit's or a result's envelope (what a node reads
// per job) without protobuf's reflection: the packet's strings are slices
// of one copy of data (one allocation, where proto.Unmarshal allocates each
// string on its own), the messages one block (as preset allocates them).
//
// It decodes only what the encoders write: each singular field at most
// once, known fields of their declared wire types, no unknown fields, a
// JobRequest's compensation absent, exactly one payload and that a
// job_request or a job_result. For anything else — and for anything
// malformed, whose error proto.Unmarshal reports — it returns nil and
// Decode unmarshals with protobuf. What it returns is what proto.Unmarshal
// returns for data (FuzzDecodeIsProtoUnmarshal).
//
// The strings share their copy of data: a string kept alone keeps the
// whole packet's bytes (a few hundred) alive.
func fastDecode(data []byte) *capv1.BusPacket {
	payload, ok := fastPayload(data)
	if !ok {
		return nil
	}
	buf := make([]byte, len(data))
	copy(buf, data)
	var p *capv1.BusPacket
	var req *capv1.JobRequest
	var res *capv1.JobResult
	var ts *timestamppb.Timestamp
	if payload == requestField {
		blk := &requestBlock{}
		blk.w.JobRequest = &blk.req
		blk.p.Payload = &blk.w
		p, req, ts = &blk.p, &blk.req, &blk.ts
	} else {
		blk := &resultBlock{}
		blk.w.JobResult = &blk.res
		blk.p.Payload = &blk.w
		p, res, ts = &blk.p, &blk.res, &blk.ts
	}
	var seen uint64
	ok = eachField(buf, func(num protowire.Number, typ protowire.Type, x uint64, v []byte) bool {
		if !once(&seen, num) {
			return false
		}
		ok := true
		switch {
		case num == 4 && typ == protowire.VarintType:
			p.ProtocolVersion = int32(x)
		case typ != protowire.BytesType:
			return false
		case num == 1:
			p.TraceId, ok = str(v)
		case num == 2:
			p.SenderId, ok = str(v)
		case num == 3:
			ok = timestamp(v, ts)
			p.CreatedAt = ts
		case num == 14:
			// Bytes of its own, as protobuf's (a caller may change them).
			p.Signature = append([]byte(nil), v...)
		case num == requestField:
			ok = request(v, req)
		case num == resultField:
			ok = result(v, res)
		default:
			return false
		}
		return ok
	})
	if !ok {
		return nil
	}
	return p
}

// fastPayload scans data's top-level tags: ok when it holds exactly one
// payload, a job_request or a job_result (field 10 or 11), which it returns.
func fastPayload(data []byte) (protowire.Number, bool) {
	var payload protowire.Number
	for b := data; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, false
		}
		b = b[n:]
		if num >= 10 && num <= 16 && num != 14 {
			if payload != 0 || typ != protowire.BytesType || (num != requestField && num != resultField) {
				return 0, false
			}
			payload = num
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return 0, false
		}
		b = b[n:]
	}
	return payload, payload != 0
}

// eachField calls f with each field of message b in turn: its number,
// its wire type and its value (x a varint's, v a length-delimited field's
// bytes, a slice of b). It reports false, and stops, where f does, and for
// a field of another wire type or anything malformed.
func eachField(b []byte, f func(num protowire.Number, typ protowire.Type, x uint64, v []byte) bool) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		var x uint64
		var v []byte
		switch typ {
		case protowire.VarintType:
			x, n = protowire.ConsumeVarint(b)
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
		default:
			return false
		}
		if n < 0 || !f(num, typ, x, v) {
			return false
		}
		b = b[n:]
	}
	return true
}

// once marks field num seen: false when it was already (a singular field
// twice, which protobuf merges) or its number is past 63.
func once(seen *uint64, num protowire.Number) bool {
	if num > 63 || *seen&(1<<num) != 0 {
		return false
	}
	*seen |= 1 << num
	return true
}

// str returns v, a slice of the packet's copy (never changed), as a
// string; ok is false when v is not UTF-8 (proto3 strings must be;
// protobuf reports the error).
func str(v []byte) (string, bool) {
	if len(v) == 0 {
		return "", true
	}
	if !utf8.Valid(v) {
		return "", false
	}
	return unsafe.String(&v[0], len(v)), true
}

// timestamp decodes a google.protobuf.Timestamp into m.
func timestamp(b []byte, m *timestamppb.Timestamp) bool {
	var seen uint64
	return eachField(b, func(num protowire.Number, typ protowire.Type, x uint64, _ []byte) bool {
		if !once(&seen, num) || typ != protowire.VarintType {
			return false
		}
		switch num {
		case 1:
			m.Seconds = int64(x)
		case 2:
			m.Nanos = int32(x)
		default:
			return false
		}
		return true
	})
}

// request decodes a JobRequest into r (empty). A compensation (field 100)
// is left to protobuf.
func request(b []byte, r *capv1.JobRequest) bool {
	var seen uint64
	return eachField(b, func(num protowire.Number, typ protowire.Type, x uint64, v []byte) bool {
		if num != 6 && num != 15 && !once(&seen, num) {
			return false
		}
		ok := true
		switch {
		case num == 3 && typ == protowire.VarintType:
			r.Priority = capv1.JobPriority(int32(x))
		case num == 9 && typ == protowire.VarintType:
			r.StepIndex = int32(x)
		case typ != protowire.BytesType:
			return false
		case num == 1:
			r.JobId, ok = str(v)
		case num == 2:
			r.Topic, ok = str(v)
		case num == 4:
			r.ContextPtr, ok = str(v)
		case num == 5:
			r.AdapterId, ok = str(v)
		case num == 7:
			r.ParentJobId, ok = str(v)
		case num == 8:
			r.WorkflowId, ok = str(v)
		case num == 10:
			r.MemoryId, ok = str(v)
		case num == 13:
			r.TenantId, ok = str(v)
		case num == 14:
			r.PrincipalId, ok = str(v)
		case num == 6:
			ok = mapEntry(v, &r.Env)
		case num == 15:
			ok = mapEntry(v, &r.Labels)
		case num == 11:
			r.ContextHints = &capv1.ContextHints{}
			ok = hints(v, r.ContextHints)
		case num == 12:
			r.Budget = &capv1.Budget{}
			ok = budget(v, r.Budget)
		case num == 16:
			r.Meta = &capv1.JobMetadata{}
			ok = meta(v, r.Meta)
		default:
			return false
		}
		return ok
	})
}

// result decodes a JobResult into r (empty).
func result(b []byte, r *capv1.JobResult) bool {
	var seen uint64
	return eachField(b, func(num protowire.Number, typ protowire.Type, x uint64, v []byte) bool {
		if num != 8 && !once(&seen, num) {
			return false
		}
		ok := true
		switch {
		case num == 2 && typ == protowire.VarintType:
			r.Status = capv1.JobStatus(int32(x))
		case num == 5 && typ == protowire.VarintType:
			r.ExecutionMs = int64(x)
		case typ != protowire.BytesType:
			return false
		case num == 1:
			r.JobId, ok = str(v)
		case num == 3:
			r.ResultPtr, ok = str(v)
		case num == 4:
			r.WorkerId, ok = str(v)
		case num == 6:
			r.ErrorCode, ok = str(v)
		case num == 7:
			r.ErrorMessage, ok = str(v)
		case num == 8:
			r.ArtifactPtrs, ok = appendStr(r.ArtifactPtrs, v)
		default:
			return false
		}
		return ok
	})
}

// appendStr appends v as a string (see str) to l.
func appendStr(l []string, v []byte) ([]string, bool) {
	s, ok := str(v)
	if !ok {
		return l, false
	}
	return append(l, s), true
}

// mapEntry adds a map<string, string> entry (key 1, value 2, each at most
// once, either absent meaning "") to *m, made when nil; a later entry of
// the same key replaces an earlier one, as in protobuf.
func mapEntry(b []byte, m *map[string]string) bool {
	var k, val string
	var seen uint64
	ok := eachField(b, func(num protowire.Number, typ protowire.Type, _ uint64, v []byte) bool {
		if !once(&seen, num) || typ != protowire.BytesType {
			return false
		}
		ok := true
		switch num {
		case 1:
			k, ok = str(v)
		case 2:
			val, ok = str(v)
		default:
			return false
		}
		return ok
	})
	if !ok {
		return false
	}
	if *m == nil {
		*m = make(map[string]string)
	}
	(*m)[k] = val
	return true
}

// budget decodes a Budget (four int64s) into g.
func budget(b []byte, g *capv1.Budget) bool {
	var seen uint64
	return eachField(b, func(num protowire.Number, typ protowire.Type, x uint64, _ []byte) bool {
		if !once(&seen, num) || typ != protowire.VarintType {
			return false
		}
		switch num {
		case 1:
			g.MaxInputTokens = int64(x)
		case 2:
			g.MaxOutputTokens = int64(x)
		case 3:
			g.MaxTotalTokens = int64(x)
		case 4:
			g.DeadlineMs = int64(x)
		default:
			return false
		}
		return true
	})
}

// hints decodes a ContextHints into h.
func hints(b []byte, h *capv1.ContextHints) bool {
	var seen uint64
	return eachField(b, func(num protowire.Number, typ protowire.Type, x uint64, v []byte) bool {
		if num != 4 && !once(&seen, num) {
			return false
		}
		ok := true
		switch {
		case num == 4 && typ == protowire.BytesType:
			h.Tags, ok = appendStr(h.Tags, v)
		case typ != protowire.VarintType:
			return false
		case num == 1:
			h.MaxInputTokens = int32(x)
		case num == 2:
			h.AllowSummarization = x != 0
		case num == 3:
			h.AllowRetrieval = x != 0
		default:
			return false
		}
		return ok
	})
}

// meta decodes a JobMetadata into m.
func meta(b []byte, m *capv1.JobMetadata) bool {
	var seen uint64
	return eachField(b, func(num protowire.Number, typ protowire.Type, x uint64, v []byte) bool {
		if num != 6 && num != 7 && num != 9 && !once(&seen, num) {
			return false
		}
		ok := true
		switch {
		case num == 3 && typ == protowire.VarintType:
			m.ActorType = capv1.ActorType(int32(x))
		case typ != protowire.BytesType:
			return false
		case num == 1:
			m.TenantId, ok = str(v)
		case num == 2:
			m.ActorId, ok = str(v)
		case num == 4:
			m.IdempotencyKey, ok = str(v)
		case num == 5:
			m.Capability, ok = str(v)
		case num == 8:
			m.PackId, ok = str(v)
		case num == 6:
			m.RiskTags, ok = appendStr(m.RiskTags, v)
		case num == 7:
			m.Requires, ok = appendStr(m.Requires, v)
		case num == 9:
			ok = mapEntry(v, &m.Labels)
		default:
			return false
		}
		return ok
	})
}
