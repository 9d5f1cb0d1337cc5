package safety

// Test names of unexported constants.
const (
	EnvPolicyConstraints        = envPolicyConstraints
	EnvRedactionLevel           = envRedactionLevel
	EnvMaxArtifactBytes         = envMaxArtifactBytes
	EnvMaxConcurrentJobs        = envMaxConcurrentJobs
	EnvMaxRetries               = envMaxRetries
	RuleNonJobTopic             = ruleNonJobTopic
	RuleDefaultAllow            = ruleDefaultAllow
	RedisPointerPrefix          = redisPointerPrefix
	OutputMaxResultBytesDefault = outputMaxResultBytesDefault
)
