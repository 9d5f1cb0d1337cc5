package bench

import (
	"image"
	"image/color"
	"strings"
)

// A 3×5 pixel font, enough to label a chart without a font package (the
// standard library has none). Each glyph is five rows of three cells, '#' on.
// Lower case is drawn as upper case; a character without a glyph is a space.
var glyphRows = map[rune]string{
	'0': "###/#.#/#.#/#.#/###", '1': ".#./##./.#./.#./###", '2': "###/..#/###/#../###",
	'3': "###/..#/###/..#/###", '4': "#.#/#.#/###/..#/..#", '5': "###/#../###/..#/###",
	'6': "###/#../###/#.#/###", '7': "###/..#/..#/..#/..#", '8': "###/#.#/###/#.#/###",
	'9': "###/#.#/###/..#/###",
	'A': ".#./#.#/###/#.#/#.#", 'B': "##./#.#/##./#.#/##.", 'C': "###/#../#../#../###",
	'D': "##./#.#/#.#/#.#/##.", 'E': "###/#../##./#../###", 'F': "###/#../##./#../#..",
	'G': "###/#../#.#/#.#/###", 'H': "#.#/#.#/###/#.#/#.#", 'I': "###/.#./.#./.#./###",
	'J': "..#/..#/..#/#.#/###", 'K': "#.#/#.#/##./#.#/#.#", 'L': "#../#../#../#../###",
	'M': "#.#/###/###/#.#/#.#", 'N': "##./#.#/#.#/#.#/#.#", 'O': ".#./#.#/#.#/#.#/.#.",
	'P': "###/#.#/###/#../#..", 'Q': "###/#.#/#.#/###/..#", 'R': "##./#.#/##./#.#/#.#",
	'S': "###/#../###/..#/###", 'T': "###/.#./.#./.#./.#.", 'U': "#.#/#.#/#.#/#.#/###",
	'V': "#.#/#.#/#.#/#.#/.#.", 'W': "#.#/#.#/###/###/#.#", 'X': "#.#/#.#/.#./#.#/#.#",
	'Y': "#.#/#.#/.#./.#./.#.", 'Z': "###/..#/.#./#../###",
	'.': ".../.../.../.../.#.", ',': ".../.../.../.#./#..", ':': ".../.#./.../.#./...",
	'/': "..#/..#/.#./#../#..", '-': ".../.../###/.../...", '%': "#../..#/.#./#../..#",
	'(': ".#./#../#../#../.#.", ')': ".#./..#/..#/..#/.#.", '=': ".../###/.../###/...",
	'>': "#../.#./..#/.#./#..", '+': ".../.#./###/.#./...", '_': ".../.../.../.../###",
	'|': ".#./.#./.#./.#./.#.",
}

// fontScale enlarges each cell to fontScale×fontScale pixels.
const fontScale = 2

// glyph cell and advance, in pixels.
const (
	glyphW   = 3 * fontScale
	glyphH   = 5 * fontScale
	advanceW = glyphW + fontScale
)

// textWidth is the width of s in pixels.
func textWidth(s string) int { return len([]rune(s)) * advanceW }

// drawText draws s with its top-left corner at (x, y).
func drawText(img *image.RGBA, x, y int, s string, c color.Color) {
	for _, r := range strings.ToUpper(s) {
		if r == '→' {
			r = '>'
		}
		rows := strings.Split(glyphRows[r], "/")
		for ry, row := range rows {
			for rx, cell := range row {
				if cell != '#' {
					continue
				}
				for dy := 0; dy < fontScale; dy++ {
					for dx := 0; dx < fontScale; dx++ {
						img.Set(x+rx*fontScale+dx, y+ry*fontScale+dy, c)
					}
				}
			}
		}
		x += advanceW
	}
}
