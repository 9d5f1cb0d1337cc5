package policyx

// Environment variables the kernel client (`troupe node`) reads. The names are the
// ones CAP deployments already set.
const (
	EnvKernelAddr     = "SAFETY_KERNEL_ADDR"
	EnvKernelTLSCA    = "SAFETY_KERNEL_TLS_CA"
	EnvKernelTLSReq   = "SAFETY_KERNEL_TLS_REQUIRED"
	EnvKernelInsecure = "SAFETY_KERNEL_INSECURE"
	EnvFailMode       = "TROUPE_POLICY_CHECK_FAIL_MODE"
	EnvDecisionTTL    = "SAFETY_DECISION_CACHE_TTL"
)
