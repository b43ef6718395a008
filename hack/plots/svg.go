package plots

import (
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// SVGTexts reads the SVG document at path and returns the contents of its
// text elements (labels, titles, legends), in document order. It fails on
// an empty file, malformed XML or a root element other than svg: the
// check the charts' tests make.
func SVGTexts(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	dec := xml.NewDecoder(f)
	var texts []string
	root, inText := "", false
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: not well-formed XML: %w", path, err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = tok.Name.Local
			}
			inText = tok.Name.Local == "text"
		case xml.CharData:
			if inText {
				texts = append(texts, string(tok))
			}
		case xml.EndElement:
			inText = false
		}
	}
	if root != "svg" {
		return nil, fmt.Errorf("%s: root element %q, want svg", path, root)
	}
	return texts, nil
}

// CountTexts counts the texts that contain s.
func CountTexts(texts []string, s string) int {
	n := 0
	for _, t := range texts {
		if strings.Contains(t, s) {
			n++
		}
	}
	return n
}
