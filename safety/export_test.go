package safety

// Test names of unexported constants.
const (
	RuleNonJobTopic             = ruleNonJobTopic
	RuleDefaultAllow            = ruleDefaultAllow
	RedisPointerPrefix          = redisPointerPrefix
	OutputMaxResultBytesDefault = outputMaxResultBytesDefault
)
