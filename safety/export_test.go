package safety

// Test names of unexported constants.
const (
	EnvPolicyConstraints        = envPolicyConstraints
	EnvRedactionLevel           = envRedactionLevel
	EnvMaxArtifactBytes         = envMaxArtifactBytes
	EnvMaxConcurrentJobs        = envMaxConcurrentJobs
	EnvMaxRetries               = envMaxRetries
	PhaseMeta                   = phaseMeta
	RuleNonJobTopic             = ruleNonJobTopic
	RuleDefaultAllow            = ruleDefaultAllow
	RedisPointerPrefix          = redisPointerPrefix
	OutputMaxResultBytesDefault = outputMaxResultBytesDefault
)
