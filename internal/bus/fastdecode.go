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
	d := fastDec{buf: make([]byte, len(data))}
	copy(d.buf, data)
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
	for b := d.buf; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || num > 63 || seen&(1<<num) != 0 {
			return nil
		}
		seen |= 1 << num
		b = b[n:]
		switch {
		case num == 4 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return nil
			}
			p.ProtocolVersion = int32(v)
			b = b[n:]
			continue
		case typ != protowire.BytesType:
			return nil
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return nil
		}
		b = b[n:]
		switch num {
		case 1:
			if p.TraceId, ok = d.str(v); !ok {
				return nil
			}
		case 2:
			if p.SenderId, ok = d.str(v); !ok {
				return nil
			}
		case 3:
			if !timestamp(v, ts) {
				return nil
			}
			p.CreatedAt = ts
		case 14:
			// Bytes of its own, as protobuf's (a caller may change them).
			p.Signature = append([]byte(nil), v...)
		case 10:
			if !d.request(v, req) {
				return nil
			}
		case 11:
			if !d.result(v, res) {
				return nil
			}
		default:
			return nil
		}
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

// timestamp decodes a google.protobuf.Timestamp into m: seconds (1),
// nanos (2), each at most once.
func timestamp(b []byte, m *timestamppb.Timestamp) bool {
	var seen uint8
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.VarintType || (num != 1 && num != 2) || seen&(1<<num) != 0 {
			return false
		}
		seen |= 1 << num
		b = b[n:]
		v, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		if num == 1 {
			m.Seconds = int64(v)
		} else {
			m.Nanos = int32(v)
		}
	}
	return true
}

// fastDec hands out strings that are slices of buf, a copy of the packet
// decoded (never changed once copied).
type fastDec struct {
	buf []byte
}

// str returns v, a slice of d.buf, as a string; ok is false when v is not
// UTF-8 (proto3 strings must be; protobuf reports the error).
func (d *fastDec) str(v []byte) (string, bool) {
	if len(v) == 0 {
		return "", true
	}
	if !utf8.Valid(v) {
		return "", false
	}
	return unsafe.String(&v[0], len(v)), true
}

// request decodes a JobRequest into r (empty).
func (d *fastDec) request(b []byte, r *capv1.JobRequest) bool {
	var seen uint32
	var ok bool
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || num > 16 {
			return false
		}
		rep := num == 6 || num == 15
		if !rep {
			if seen&(1<<num) != 0 {
				return false
			}
			seen |= 1 << num
		}
		b = b[n:]
		if num == 3 || num == 9 {
			if typ != protowire.VarintType {
				return false
			}
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return false
			}
			b = b[n:]
			if num == 3 {
				r.Priority = capv1.JobPriority(int32(v))
			} else {
				r.StepIndex = int32(v)
			}
			continue
		}
		if typ != protowire.BytesType {
			return false
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		switch num {
		case 1:
			r.JobId, ok = d.str(v)
		case 2:
			r.Topic, ok = d.str(v)
		case 4:
			r.ContextPtr, ok = d.str(v)
		case 5:
			r.AdapterId, ok = d.str(v)
		case 7:
			r.ParentJobId, ok = d.str(v)
		case 8:
			r.WorkflowId, ok = d.str(v)
		case 10:
			r.MemoryId, ok = d.str(v)
		case 13:
			r.TenantId, ok = d.str(v)
		case 14:
			r.PrincipalId, ok = d.str(v)
		case 6:
			ok = d.mapEntry(v, &r.Env)
		case 15:
			ok = d.mapEntry(v, &r.Labels)
		case 11:
			r.ContextHints = &capv1.ContextHints{}
			ok = d.hints(v, r.ContextHints)
		case 12:
			r.Budget = &capv1.Budget{}
			ok = budget(v, r.Budget)
		case 16:
			r.Meta = &capv1.JobMetadata{}
			ok = d.meta(v, r.Meta)
		default:
			ok = false
		}
		if !ok {
			return false
		}
	}
	return true
}

// result decodes a JobResult into r (empty).
func (d *fastDec) result(b []byte, r *capv1.JobResult) bool {
	var seen uint16
	var ok bool
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || num > 8 {
			return false
		}
		if num != 8 {
			if seen&(1<<num) != 0 {
				return false
			}
			seen |= 1 << num
		}
		b = b[n:]
		if num == 2 || num == 5 {
			if typ != protowire.VarintType {
				return false
			}
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return false
			}
			b = b[n:]
			if num == 2 {
				r.Status = capv1.JobStatus(int32(v))
			} else {
				r.ExecutionMs = int64(v)
			}
			continue
		}
		if typ != protowire.BytesType {
			return false
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		switch num {
		case 1:
			r.JobId, ok = d.str(v)
		case 3:
			r.ResultPtr, ok = d.str(v)
		case 4:
			r.WorkerId, ok = d.str(v)
		case 6:
			r.ErrorCode, ok = d.str(v)
		case 7:
			r.ErrorMessage, ok = d.str(v)
		case 8:
			var s string
			if s, ok = d.str(v); ok {
				r.ArtifactPtrs = append(r.ArtifactPtrs, s)
			}
		default:
			ok = false
		}
		if !ok {
			return false
		}
	}
	return true
}

// mapEntry adds a map<string, string> entry (key 1, value 2, each at most
// once, either absent meaning "") to *m, made when nil; a later entry of
// the same key replaces an earlier one, as in protobuf.
func (d *fastDec) mapEntry(b []byte, m *map[string]string) bool {
	var k, v string
	var seen uint8
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.BytesType || (num != 1 && num != 2) || seen&(1<<num) != 0 {
			return false
		}
		seen |= 1 << num
		b = b[n:]
		s, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		str, ok := d.str(s)
		if !ok {
			return false
		}
		if num == 1 {
			k = str
		} else {
			v = str
		}
	}
	if *m == nil {
		*m = make(map[string]string)
	}
	(*m)[k] = v
	return true
}

// budget decodes a Budget (four int64s) into g.
func budget(b []byte, g *capv1.Budget) bool {
	var seen uint8
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.VarintType || num < 1 || num > 4 || seen&(1<<num) != 0 {
			return false
		}
		seen |= 1 << num
		b = b[n:]
		v, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		switch num {
		case 1:
			g.MaxInputTokens = int64(v)
		case 2:
			g.MaxOutputTokens = int64(v)
		case 3:
			g.MaxTotalTokens = int64(v)
		case 4:
			g.DeadlineMs = int64(v)
		}
	}
	return true
}

// hints decodes a ContextHints into h.
func (d *fastDec) hints(b []byte, h *capv1.ContextHints) bool {
	var seen uint8
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || num < 1 || num > 4 {
			return false
		}
		b = b[n:]
		if num == 4 {
			if typ != protowire.BytesType {
				return false
			}
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return false
			}
			b = b[n:]
			s, ok := d.str(v)
			if !ok {
				return false
			}
			h.Tags = append(h.Tags, s)
			continue
		}
		if typ != protowire.VarintType || seen&(1<<num) != 0 {
			return false
		}
		seen |= 1 << num
		v, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		switch num {
		case 1:
			h.MaxInputTokens = int32(v)
		case 2:
			h.AllowSummarization = v != 0
		case 3:
			h.AllowRetrieval = v != 0
		}
	}
	return true
}

// meta decodes a JobMetadata into m.
func (d *fastDec) meta(b []byte, m *capv1.JobMetadata) bool {
	var seen uint16
	var ok bool
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || num < 1 || num > 9 {
			return false
		}
		if num != 6 && num != 7 && num != 9 {
			if seen&(1<<num) != 0 {
				return false
			}
			seen |= 1 << num
		}
		b = b[n:]
		if num == 3 {
			if typ != protowire.VarintType {
				return false
			}
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return false
			}
			b = b[n:]
			m.ActorType = capv1.ActorType(int32(v))
			continue
		}
		if typ != protowire.BytesType {
			return false
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		var s string
		switch num {
		case 1:
			m.TenantId, ok = d.str(v)
		case 2:
			m.ActorId, ok = d.str(v)
		case 4:
			m.IdempotencyKey, ok = d.str(v)
		case 5:
			m.Capability, ok = d.str(v)
		case 8:
			m.PackId, ok = d.str(v)
		case 6:
			if s, ok = d.str(v); ok {
				m.RiskTags = append(m.RiskTags, s)
			}
		case 7:
			if s, ok = d.str(v); ok {
				m.Requires = append(m.Requires, s)
			}
		case 9:
			ok = d.mapEntry(v, &m.Labels)
		}
		if !ok {
			return false
		}
	}
	return true
}
