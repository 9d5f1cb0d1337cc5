package admin

import (
	"embed"
	"io/fs"
	"net/http"
)

// The dashboard is plain HTML, CSS and JavaScript with no dependencies,
// embedded in the binary so it works on a machine with no internet. It
// calls the JSON API like any other client.
//
//go:embed ui
var uiFiles embed.FS

func uiHandler() http.Handler {
	sub, err := fs.Sub(uiFiles, "ui")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	files := http.StripPrefix("/ui/", http.FileServer(http.FS(sub)))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The page loads only its own scripts and talks only to this
		// server; a policy saying so blunts any injected markup.
		w.Header().Set("Content-Security-Policy",
			"default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Referrer-Policy", "no-referrer")
		files.ServeHTTP(w, r)
	})
}
